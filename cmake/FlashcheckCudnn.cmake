# cuDNN and its frontend (header-only C++), both optional: without either, the
# build says so in one line and the `cudnn` subject is absent. Sets
# FLASHCHECK_HAVE_CUDNN and the target flashcheck::cudnn.
#
#   CUDNN_ROOT                  a cuDNN install (include/cudnn.h, lib/libcudnn.so)
#   CUDNN_FRONTEND_INCLUDE_DIR  the frontend's include folder (cudnn_frontend.h)
#
# Searched otherwise: the CUDA toolkit, the system (multiarch) folders, the
# headers scripts/setup unpacks under build/deps/cudnn-frontend, and .deps/.
set(FLASHCHECK_HAVE_CUDNN OFF)
option(FLASHCHECK_CUDNN "Build the cuDNN SDPA oracle/subject when cuDNN and its frontend are found" ON)
if(FLASHCHECK_CUDNN AND FLASHCHECK_HAVE_CUDA)
  set(_cudnn_hints ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_ROOT})
  find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${_cudnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include include/x86_64-linux-gnu x86_64-linux-gnu)
  find_library(CUDNN_LIBRARY cudnn HINTS ${_cudnn_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
  find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
            HINTS ${PROJECT_SOURCE_DIR}/build/deps/cudnn-frontend/include ${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/include
                  $ENV{CUDNN_FRONTEND_INCLUDE_DIR})
  if(CUDNN_INCLUDE_DIR AND CUDNN_LIBRARY AND CUDNN_FRONTEND_INCLUDE_DIR)
    file(STRINGS "${CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_version REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCHLEVEL ([0-9]+).*" "\\1.\\2.\\3" CUDNN_VERSION "${_cudnn_version}")
    add_library(flashcheck::cudnn INTERFACE IMPORTED)
    target_include_directories(flashcheck::cudnn SYSTEM INTERFACE ${CUDNN_FRONTEND_INCLUDE_DIR} ${CUDNN_INCLUDE_DIR})
    # The frontend compiles some engines at run time (NVRTC) and calls the driver API.
    target_link_libraries(flashcheck::cudnn INTERFACE ${CUDNN_LIBRARY} CUDA::cudart CUDA::nvrtc CUDA::cuda_driver)
    set(FLASHCHECK_HAVE_CUDNN ON)
    message(STATUS "flashcheck: cuDNN ${CUDNN_VERSION} (${CUDNN_LIBRARY}) with the frontend in ${CUDNN_FRONTEND_INCLUDE_DIR}: the cudnn subject is built")
  else()
    message(STATUS "flashcheck: cuDNN or its frontend headers not found (cudnn.h: ${CUDNN_INCLUDE_DIR}, frontend: ${CUDNN_FRONTEND_INCLUDE_DIR}; set CUDNN_ROOT / CUDNN_FRONTEND_INCLUDE_DIR, or run scripts/setup): the cudnn subject is absent")
  endif()
elseif(NOT FLASHCHECK_HAVE_CUDA)
  message(STATUS "flashcheck: no CUDA: the cudnn subject is absent")
endif()
