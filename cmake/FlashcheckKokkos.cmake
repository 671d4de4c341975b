# Kokkos is optional. Sets FLASHCHECK_HAVE_KOKKOS and, when found, the target
# flashcheck::kokkos.
#
# 1. find_package(Kokkos CONFIG): a proper Kokkos install (Kokkos_ROOT or
#    CMAKE_PREFIX_PATH), accepted when its include directories exist.
# 2. Debian's Trilinos Kokkos (libtrilinos-kokkos-dev: Kokkos 3.4, Serial).
#    Its KokkosConfig.cmake is broken (Kokkos::kokkos points at
#    <libdir>/../include, i.e. /usr/lib/include, which does not exist), so the
#    headers (a `trilinos` folder of the include directory) and
#    libtrilinos_kokkoscore are found directly.
set(FLASHCHECK_HAVE_KOKKOS OFF)
option(FLASHCHECK_KOKKOS "Build the Kokkos reference when Kokkos is found" ON)

if(FLASHCHECK_KOKKOS)
  find_package(Kokkos CONFIG QUIET)
  if(Kokkos_FOUND AND TARGET Kokkos::kokkos)
    get_target_property(_kokkos_includes Kokkos::kokkos INTERFACE_INCLUDE_DIRECTORIES)
    set(_kokkos_usable ON)
    foreach(_dir IN LISTS _kokkos_includes)
      if(NOT _dir MATCHES "^\\$<" AND NOT EXISTS "${_dir}/Kokkos_Core.hpp")
        set(_kokkos_usable OFF)
      endif()
    endforeach()
    if(_kokkos_usable)
      add_library(flashcheck::kokkos INTERFACE IMPORTED)
      target_link_libraries(flashcheck::kokkos INTERFACE Kokkos::kokkos)
      set(FLASHCHECK_HAVE_KOKKOS ON)
      set(FLASHCHECK_KOKKOS_SOURCE "Kokkos ${Kokkos_VERSION} (${Kokkos_DIR})")
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

if(FLASHCHECK_HAVE_KOKKOS)
  message(STATUS "flashcheck: Kokkos reference enabled: ${FLASHCHECK_KOKKOS_SOURCE}")
else()
  message(STATUS "flashcheck: Kokkos not found or FLASHCHECK_KOKKOS=OFF (install libtrilinos-kokkos-dev or set Kokkos_ROOT): the Kokkos reference is not built and its tests are skipped")
endif()
