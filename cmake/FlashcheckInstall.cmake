# `cmake --install`: the CLI, the libraries a consumer links with their public
# headers, report.py with the record schema, and a find_package(flashcheck)
# package whose targets are `flashcheck::<lib>` (flashcheck_core becomes
# flashcheck::core). Layout: FlashcheckInstallDirs.cmake. Consumer's side:
# examples/own-kernel/ and README.md ("Using flashcheck from another project").
#
# What is exported, and what is not:
# - The STATIC libraries below and everything they link (found by walking
#   their link libraries, so that a library one of them starts to link joins
#   the export without an edit here).
# - Not the OBJECT libraries (flashcheck's kernels, mutants, the cpu-lowp smoke
#   subject, the cuDNN subject): each registers itself from a static object,
#   which a consumer's link would keep or drop by accident. A consumer
#   registers its own subject explicitly (flashcheck/core/registration.hpp).
#   Their headers (kernels/include) are not installed either.
# - Dependencies: a package's imported targets (fmt::, nlohmann_json::,
#   OpenMP::, rapidcheck, CUDA::, Kokkos::, GTest::) become find_dependency
#   calls in flashcheckConfig.cmake; flashcheck's own imported targets from
#   its find modules (flashcheck::kokkos, ::cudnn, ::mpfr) are written out with
#   the library paths this build found (generated file
#   flashcheckImportedTargets.cmake), for the link lines of the static
#   libraries that use them privately (the Kokkos reference, inside the oracles).

# The libraries a consumer may link. The walk below adds what they link.
set(FLASHCHECK_EXPORTED_LIBRARIES
    flashcheck_core flashcheck_gpu flashcheck_oracles flashcheck_judge flashcheck_generators
    flashcheck_fuzz flashcheck_reports flashcheck_external)
# ---- flashcheck::testing (issue 21 item 6: properties/, helper "testing") ----
# The property suite as a library, `flashcheck::testing::add_property_tests(Subject&)`
# in "flashcheck/testing/property_suite.hpp". Exported with its headers
# (properties/include/flashcheck/testing/) once the target exists; its GoogleTest
# and RapidCheck dependencies come with it through the walk. The example
# (examples/own-kernel) calls it when `TARGET flashcheck::testing` is true.
if(TARGET flashcheck_testing)
  list(APPEND FLASHCHECK_EXPORTED_LIBRARIES flashcheck_testing)
endif()
# -----------------------------------------------------------------------------

# Imported target (or its prefix before ::) -> the package that provides it.
set(_flashcheck_packages
    "fmt=fmt" "nlohmann_json=nlohmann_json" "OpenMP=OpenMP" "rapidcheck=rapidcheck"
    "rapidcheck_gtest=rapidcheck" "CUDA=CUDAToolkit" "Kokkos=Kokkos" "GTest=GTest" "CLI11=CLI11")

# Walks the link libraries from the roots: the non-imported library targets
# (exported), flashcheck::'s own imported targets, and the packages needed.
set(_queue ${FLASHCHECK_EXPORTED_LIBRARIES})
set(_exported "")
set(_own_imported "")
set(_packages "")
while(_queue)
  list(POP_FRONT _queue _target)
  get_target_property(_aliased ${_target} ALIASED_TARGET)
  if(_aliased)
    set(_target ${_aliased})
  endif()
  if(_target IN_LIST _exported OR _target IN_LIST _own_imported)
    continue()
  endif()
  get_target_property(_imported ${_target} IMPORTED)
  get_target_property(_type ${_target} TYPE)
  if(_imported)
    if(_target MATCHES "^flashcheck::")
      list(APPEND _own_imported ${_target})
      get_target_property(_links ${_target} INTERFACE_LINK_LIBRARIES)
    else()
      string(REGEX REPLACE "::.*$" "" _prefix "${_target}")
      set(_package "")
      foreach(_entry IN LISTS _flashcheck_packages)
        string(REPLACE "=" ";" _pair "${_entry}")
        list(GET _pair 0 _name)
        list(GET _pair 1 _provider)
        if(_name STREQUAL _prefix)
          set(_package ${_provider})
        endif()
      endforeach()
      if(NOT _package)
        message(FATAL_ERROR "flashcheck install: the exported libraries link ${_target}: name the package that provides it in cmake/FlashcheckInstall.cmake (_flashcheck_packages)")
      endif()
      list(APPEND _packages ${_package})
      continue()
    endif()
  elseif(_type STREQUAL "OBJECT_LIBRARY")
    message(FATAL_ERROR "flashcheck install: an exported library links the OBJECT library ${_target}, whose static registrations a consumer would lose: link it into executables only, or make it a STATIC library with explicit registration")
  else()
    list(APPEND _exported ${_target})
    get_target_property(_links ${_target} LINK_LIBRARIES)  # private ones too: a static library's consumers link them
    get_target_property(_interface_links ${_target} INTERFACE_LINK_LIBRARIES)
    list(APPEND _links ${_interface_links})
  endif()
  foreach(_link IN LISTS _links)
    # $<LINK_ONLY:x>, $<BUILD_INTERFACE:x> -> x; CMake's ::@(directory) markers skipped.
    string(REGEX REPLACE "^\\$<(LINK_ONLY|BUILD_INTERFACE):(.*)>$" "\\2" _link "${_link}")
    if(_link MATCHES "^::@" OR _link MATCHES "^\\$<" OR NOT TARGET "${_link}")
      continue()  # a path, a -l flag, a system library (dl), or an install-only expression
    endif()
    list(APPEND _queue ${_link})
  endforeach()
endwhile()
list(REMOVE_DUPLICATES _packages)
set(FLASHCHECK_EXPORTED_TARGETS ${_exported})

# The libraries, as flashcheck::<name without the flashcheck_ prefix>.
foreach(_target IN LISTS _exported)
  string(REGEX REPLACE "^flashcheck_" "" _export_name "${_target}")
  set_target_properties(${_target} PROPERTIES EXPORT_NAME ${_export_name})
  if(NOT TARGET flashcheck::${_export_name})
    add_library(flashcheck::${_export_name} ALIAS ${_target})  # the same names inside this build
  endif()
endforeach()
install(TARGETS ${_exported} EXPORT flashcheckTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT development
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
# The CLI, as the imported executable flashcheck::flashcheck too. It keeps the
# run-time paths of libraries outside the system folders (a cuDNN or CUDA
# toolkit under its own prefix), which an install strips otherwise.
set_target_properties(flashcheck PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
# Its own export set, in the `cli` component: an install of the `development`
# component alone has no binary for the package to check for.
install(TARGETS flashcheck EXPORT flashcheckCliTargets RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
install(EXPORT flashcheckCliTargets NAMESPACE flashcheck:: DESTINATION ${FLASHCHECK_INSTALL_CMAKEDIR} COMPONENT cli)

# Public headers: the flashcheck/ tree of each exported library's public
# include folders (its BUILD_INTERFACE paths: <lib>/include for most, and
# properties/include for flashcheck::testing, whose sources live in
# properties/testing/).
set(_header_folders "")
foreach(_target IN LISTS _exported)
  get_target_property(_includes ${_target} INTERFACE_INCLUDE_DIRECTORIES)
  if(NOT _includes)
    continue()
  endif()
  foreach(_include IN LISTS _includes)
    string(REGEX REPLACE "^\\$<BUILD_INTERFACE:(.*)>$" "\\1" _path "${_include}")
    if(NOT _path STREQUAL _include AND IS_DIRECTORY "${_path}/flashcheck")
      list(APPEND _header_folders "${_path}/flashcheck")
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _header_folders)
# Every installed header compiles on its own against the prefix (checked by
# hand: g++ -fsyntax-only of each), except what needs a dependency the package
# does not hand on: the Kokkos reference's kernels (Kokkos_Core.hpp), used only
# inside libflashcheck_kokkos_reference, stay out.
install(DIRECTORY ${_header_folders} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development
        FILES_MATCHING PATTERN "*.hpp" PATTERN "*.h" PATTERN "*.cuh" PATTERN "*.inl"
        PATTERN "kokkos_attention.hpp" EXCLUDE)

# report.py and what lies beside it (its package, templates and styles; not
# the C++ sources, its tests or their data), and the record schema it
# validates against (docs/ beside reports/, as in the source tree).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/reports/ DESTINATION ${FLASHCHECK_INSTALL_DATADIR}/reports COMPONENT cli
        PATTERN "*.cpp" EXCLUDE PATTERN "*.cu" EXCLUDE PATTERN "CMakeLists.txt" EXCLUDE PATTERN "*_test.py" EXCLUDE
        PATTERN "testdata" EXCLUDE PATTERN "include" EXCLUDE PATTERN "__pycache__" EXCLUDE)
install(FILES ${PROJECT_SOURCE_DIR}/docs/record.schema.json DESTINATION ${FLASHCHECK_INSTALL_DATADIR}/docs COMPONENT cli)

# flashcheck's own imported targets, as this build found them.
set(_imported_text "# Generated by cmake/FlashcheckInstall.cmake: flashcheck's optional dependencies as this build\n# found them (library paths of the machine that built it).\n")
foreach(_target IN LISTS _own_imported)
  string(APPEND _imported_text "if(NOT TARGET ${_target})\n  add_library(${_target} INTERFACE IMPORTED)\n")
  foreach(_property INTERFACE_LINK_LIBRARIES INTERFACE_INCLUDE_DIRECTORIES INTERFACE_COMPILE_DEFINITIONS)
    get_target_property(_value ${_target} ${_property})
    if(_value)
      string(APPEND _imported_text "  set_target_properties(${_target} PROPERTIES ${_property} \"${_value}\")\n")
    endif()
  endforeach()
  string(APPEND _imported_text "endif()\n")
endforeach()
file(WRITE ${PROJECT_BINARY_DIR}/flashcheckImportedTargets.cmake "${_imported_text}")

# find_dependency lines for flashcheckConfig.cmake.
set(FLASHCHECK_CONFIG_DEPENDENCIES "")
foreach(_package IN LISTS _packages)
  if(_package STREQUAL "Kokkos")
    # As cmake/FlashcheckKokkos.cmake: Kokkos' compiler redirection stays off.
    string(APPEND FLASHCHECK_CONFIG_DEPENDENCIES "set(Kokkos_LAUNCH_COMPILER OFF)\n")
  endif()
  string(APPEND FLASHCHECK_CONFIG_DEPENDENCIES "find_dependency(${_package})\n")
endforeach()

include(CMakePackageConfigHelpers)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/flashcheckConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/flashcheckConfig.cmake
                              INSTALL_DESTINATION ${FLASHCHECK_INSTALL_CMAKEDIR}
                              PATH_VARS FLASHCHECK_INSTALL_DATADIR)
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/flashcheckConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(EXPORT flashcheckTargets NAMESPACE flashcheck:: DESTINATION ${FLASHCHECK_INSTALL_CMAKEDIR}
        COMPONENT development)
install(FILES ${PROJECT_BINARY_DIR}/flashcheckConfig.cmake ${PROJECT_BINARY_DIR}/flashcheckConfigVersion.cmake
              ${PROJECT_BINARY_DIR}/flashcheckImportedTargets.cmake
        DESTINATION ${FLASHCHECK_INSTALL_CMAKEDIR} COMPONENT development)

string(REPLACE ";" " " _shown "${_exported}")
message(STATUS "flashcheck: install exports ${_shown}")
