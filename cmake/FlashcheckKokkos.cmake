# Kokkos is optional. Sets FLASHCHECK_HAVE_KOKKOS, FLASHCHECK_KOKKOS_CUDA and,
# when found, the target flashcheck::kokkos.
#
# 1. find_package(Kokkos CONFIG): a proper Kokkos install (-DKokkos_ROOT=... or
#    CMAKE_PREFIX_PATH), accepted when its include directories exist.
#    - A Kokkos with CUDA (scripts/build-kokkos-cuda, docs/kokkos-cuda.md) is
#      used only where this build has CUDA: the reference's one source file is
#      then compiled by nvcc as CUDA (FLASHCHECK_KOKKOS_CUDA). Kokkos' own
#      global compiler redirection (kokkos_launch_compiler, which would send
#      every command of every target through nvcc_wrapper) is turned off: the
#      target below carries Kokkos' headers and libraries only.
#    - A host-only Kokkos (Serial, OpenMP) is used as it is.
# 2. Debian's Trilinos Kokkos (libtrilinos-kokkos-dev: Kokkos 3.4, Serial).
#    Its KokkosConfig.cmake is broken (Kokkos::kokkos points at
#    <libdir>/../include, i.e. /usr/lib/include, which does not exist), so the
#    headers (a `trilinos` folder of the include directory) and
#    libtrilinos_kokkoscore are found directly.
set(FLASHCHECK_HAVE_KOKKOS OFF)
set(FLASHCHECK_KOKKOS_CUDA OFF)
option(FLASHCHECK_KOKKOS "Build the Kokkos reference when Kokkos is found" ON)

if(FLASHCHECK_KOKKOS)
  set(Kokkos_LAUNCH_COMPILER OFF)
  find_package(Kokkos CONFIG QUIET)
  if(Kokkos_FOUND AND TARGET Kokkos::kokkos)
    get_target_property(_kokkos_includes Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
    if(TARGET Kokkos::kokkoscore)
      get_target_property(_kokkos_core_includes Kokkos::kokkoscore INTERFACE_INCLUDE_DIRECTORIES)
      list(APPEND _kokkos_includes ${_kokkos_core_includes})
    endif()
    set(_kokkos_usable ON)
    foreach(_dir IN LISTS _kokkos_includes)
      if(_dir AND NOT _dir MATCHES "^\\$<" AND NOT EXISTS "${_dir}")
        set(_kokkos_usable OFF)
      endif()
    endforeach()
    set(_kokkos_has_cuda OFF)
    if("CUDA" IN_LIST Kokkos_DEVICES)
      set(_kokkos_has_cuda ON)
    endif()
    if(_kokkos_usable AND _kokkos_has_cuda AND NOT FLASHCHECK_HAVE_CUDA)
      message(STATUS "flashcheck: ${Kokkos_DIR} is a CUDA Kokkos but this build has no CUDA: ignored")
      set(_kokkos_usable OFF)
    endif()
    if(_kokkos_usable AND _kokkos_has_cuda)
      # Headers and libraries only (see above); the reference compiles as CUDA.
      get_target_property(_kokkos_core_library Kokkos::kokkoscore LOCATION)
      add_library(flashcheck::kokkos INTERFACE IMPORTED)
      target_include_directories(flashcheck::kokkos SYSTEM INTERFACE ${_kokkos_core_includes})
      target_link_libraries(flashcheck::kokkos INTERFACE ${_kokkos_core_library} CUDA::cudart CUDA::cuda_driver
                                                         ${CMAKE_DL_LIBS})
      set(FLASHCHECK_HAVE_KOKKOS ON)
      set(FLASHCHECK_KOKKOS_CUDA ON)
      set(FLASHCHECK_KOKKOS_SOURCE "Kokkos ${Kokkos_VERSION} with ${Kokkos_DEVICES} (${Kokkos_DIR})")
    elseif(_kokkos_usable)
      add_library(flashcheck::kokkos INTERFACE IMPORTED)
      target_link_libraries(flashcheck::kokkos INTERFACE Kokkos::kokkos)
      set(FLASHCHECK_HAVE_KOKKOS ON)
      set(FLASHCHECK_KOKKOS_SOURCE "Kokkos ${Kokkos_VERSION} with ${Kokkos_DEVICES} (${Kokkos_DIR})")
    endif()
  endif()

  if(NOT FLASHCHECK_HAVE_KOKKOS)
    find_path(KOKKOS_TRILINOS_INCLUDE_DIR Kokkos_Core.hpp PATH_SUFFIXES trilinos)
    find_library(KOKKOS_TRILINOS_CORE_LIBRARY trilinos_kokkoscore)
    if(KOKKOS_TRILINOS_INCLUDE_DIR AND KOKKOS_TRILINOS_CORE_LIBRARY)
      add_library(flashcheck::kokkos INTERFACE IMPORTED)
      # SYSTEM: Kokkos 3.4's headers warn under C++20 (-Wvolatile and friends).
      target_include_directories(flashcheck::kokkos SYSTEM INTERFACE ${KOKKOS_TRILINOS_INCLUDE_DIR})
      target_link_libraries(flashcheck::kokkos INTERFACE ${KOKKOS_TRILINOS_CORE_LIBRARY} ${CMAKE_DL_LIBS})
      set(FLASHCHECK_HAVE_KOKKOS ON)
      set(FLASHCHECK_KOKKOS_SOURCE "Trilinos Kokkos (${KOKKOS_TRILINOS_CORE_LIBRARY})")
    endif()
  endif()
endif()

if(FLASHCHECK_KOKKOS_CUDA)
  message(STATUS "flashcheck: Kokkos reference enabled, on the GPU (CUDA) and the host: ${FLASHCHECK_KOKKOS_SOURCE}")
elseif(FLASHCHECK_HAVE_KOKKOS)
  message(STATUS "flashcheck: Kokkos reference enabled, on the host only (no CUDA Kokkos; see docs/kokkos-cuda.md): ${FLASHCHECK_KOKKOS_SOURCE}")
else()
  message(STATUS "flashcheck: Kokkos not found or FLASHCHECK_KOKKOS=OFF (install libtrilinos-kokkos-dev or set Kokkos_ROOT): the Kokkos reference is not built and its tests are skipped")
endif()
