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
    # CMake before 3.26 does not know nvcc's C++20 flag (nvcc has had it since 12.0).
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(FLASHCHECK_HAVE_CUDA ON)
  elseif(FLASHCHECK_CUDA STREQUAL "ON")
    message(FATAL_ERROR "flashcheck: FLASHCHECK_CUDA=ON but no CUDA compiler was found: install the CUDA toolkit or put nvcc on the PATH")
  else()
    message(STATUS "flashcheck: no CUDA toolkit found, building the CPU parts only (GPU tests will be skipped)")
  endif()
endif()
