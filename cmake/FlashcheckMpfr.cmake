# MPFR is optional: it checks the f64 oracles' own accuracy. Sets
# FLASHCHECK_HAVE_MPFR and the target flashcheck::mpfr.
set(FLASHCHECK_HAVE_MPFR OFF)
option(FLASHCHECK_MPFR "Check the oracles against MPFR when MPFR is found" ON)
if(FLASHCHECK_MPFR)
  find_path(MPFR_INCLUDE_DIR mpfr.h)
  find_library(MPFR_LIBRARY mpfr)
  find_library(GMP_LIBRARY gmp)
  # mpfr.h includes gmp.h, which Debian keeps in the multiarch folder
  # (include/x86_64-linux-gnu): found by the compiler for /usr, not for a
  # prefix unpacked elsewhere (.deps/ on a machine without a registry).
  find_path(GMP_INCLUDE_DIR gmp.h PATH_SUFFIXES ${CMAKE_LIBRARY_ARCHITECTURE})
endif()
if(FLASHCHECK_MPFR AND MPFR_INCLUDE_DIR AND MPFR_LIBRARY AND GMP_LIBRARY AND GMP_INCLUDE_DIR)
  add_library(flashcheck::mpfr INTERFACE IMPORTED)
  target_include_directories(flashcheck::mpfr INTERFACE ${MPFR_INCLUDE_DIR} ${GMP_INCLUDE_DIR})
  target_link_libraries(flashcheck::mpfr INTERFACE ${MPFR_LIBRARY} ${GMP_LIBRARY})
  set(FLASHCHECK_HAVE_MPFR ON)
  message(STATUS "flashcheck: MPFR found: the oracles' accuracy is checked at 256 bits")
else()
  message(STATUS "flashcheck: MPFR not found or FLASHCHECK_MPFR=OFF (install libmpfr-dev): the oracle-accuracy tests are skipped")
endif()
