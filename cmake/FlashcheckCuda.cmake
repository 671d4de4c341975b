# CUDA is optional. FLASHCHECK_CUDA=AUTO enables it when a toolkit is found;
# ON insists on it; OFF never looks. Sets FLASHCHECK_HAVE_CUDA.
include(CheckLanguage)
set(FLASHCHECK_HAVE_CUDA OFF)
if(NOT FLASHCHECK_CUDA STREQUAL "OFF")
  # Machine code for Ampere (sm_80) and Hopper with its architecture-specific
  # instructions (sm_90a: wgmma, setmaxnreg). Override with -DCMAKE_CUDA_ARCHITECTURES=...
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90a-real" CACHE STRING "CUDA architectures")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(FLASHCHECK_HAVE_CUDA ON)
  elseif(FLASHCHECK_CUDA STREQUAL "ON")
    message(FATAL_ERROR "flashcheck: FLASHCHECK_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit or put nvcc on the PATH")
  else()
    message(STATUS "flashcheck: no CUDA toolkit found, building the CPU parts only (GPU tests will be skipped)")
  endif()
endif()
