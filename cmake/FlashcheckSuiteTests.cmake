# flashcheck_discover_tests(TARGET [PER_SUITE] [PREFIX p] [SUITE_REGEX re]
#                           [LABELS ...] [ENVIRONMENT ...] [PROCESSORS n]
#                           [RESOURCE_GROUPS g] [TIMEOUT s]
#                           [SHARD_SUITES re SHARDS n] [COST_SUITES re COST c]
#                           [EXCLUDE_SUITES re])
#
# GoogleTest discovery, at ctest start-up (`TARGET --gtest_list_tests`, which
# touches no GPU), of the suites whose name matches SUITE_REGEX and not
# EXCLUDE_SUITES (a second call gives those their own budget):
#   - one ctest test "<p><Suite>.<Test>" per test (the default), or
#   - with PER_SUITE, one test "<p><Suite>" per suite, running `--gtest_filter=<Suite>.*`
#     in one process (the gpu-quick tier: one process per subject);
#     a suite that matches SHARD_SUITES is split into SHARDS tests "<p><Suite>/<i>",
#     GoogleTest's own sharding (GTEST_TOTAL_SHARDS, GTEST_SHARD_INDEX) dealing
#     its tests out (Gpu_cudnn: its graphs compile on the CPU, 0.5 s each).
#   - a test of a suite that matches COST_SUITES gets ctest's COST c, which
#     starts it before the tests without one where ctest has no timings of its
#     own yet (a fresh build tree): the long tests first, not in the tail.
# It replaces gtest_discover_tests, whose PROPERTIES cannot carry lists (several
# labels, several environment variables) in CMake 3.25. The subject suite
# registers its suites at run time (one per registered subject), which is why
# the listing happens when ctest starts. A test whose every case skipped (no
# GPU, too old an architecture, a missing dependency) is reported SKIPPED,
# never passed.
function(flashcheck_discover_tests target)
  cmake_parse_arguments(arg "PER_SUITE" "PREFIX;SUITE_REGEX;EXCLUDE_SUITES;RESOURCE_GROUPS;PROCESSORS;TIMEOUT;SHARD_SUITES;SHARDS;COST_SUITES;COST"
                        "LABELS;ENVIRONMENT" ${ARGN})
  if(NOT arg_SUITE_REGEX)
    set(arg_SUITE_REGEX ".")
  endif()
  if(NOT arg_EXCLUDE_SUITES)
    set(arg_EXCLUDE_SUITES "^$")
  endif()
  if(NOT arg_PROCESSORS)
    set(arg_PROCESSORS 1)
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 1500)
  endif()
  set(environment "${arg_ENVIRONMENT}")
  set(labels "${arg_LABELS}")
  string(MD5 tag "${arg_PREFIX}${arg_SUITE_REGEX}${arg_EXCLUDE_SUITES}${arg_PER_SUITE}")
  set(script "${CMAKE_CURRENT_BINARY_DIR}/${target}_tests_${tag}.cmake")
  # FIXTURES_REQUIRED test_tmp: the tests' TMPDIR, prepared before and checked
  # empty after them (properties/CMakeLists.txt).
  set(properties "LABELS \"${labels}\" PROCESSORS ${arg_PROCESSORS} ENVIRONMENT \"${environment}\" TIMEOUT ${arg_TIMEOUT} FIXTURES_REQUIRED test_tmp SKIP_REGULAR_EXPRESSION \"\\\\[  SKIPPED \\\\]\"")
  if(arg_RESOURCE_GROUPS)
    string(APPEND properties " RESOURCE_GROUPS \"${arg_RESOURCE_GROUPS}\"")
  endif()
  # A shard's test: the same properties, its shard in the environment.
  # A shard's test: the same properties, its shard in the environment, and a
  # COST that makes ctest start the shards first (without one, on a fresh
  # build, the shards waited for the first wave of 8 two-core tests on 16
  # cores: 35.6 s of a cold gpu-quick tier whose longest shard took 27 s).
  string(REPLACE "ENVIRONMENT \"${environment}\"" "ENVIRONMENT \"${environment};GTEST_TOTAL_SHARDS=${arg_SHARDS};GTEST_SHARD_INDEX=\${shard}\" COST 1000"
         shard_properties "${properties}")
  if(NOT arg_COST_SUITES OR NOT arg_COST)
    set(arg_COST_SUITES "^$")
    set(arg_COST 0)
  endif()
  if(NOT arg_SHARD_SUITES OR NOT arg_SHARDS)
    set(arg_SHARD_SUITES "^$")
    set(arg_SHARDS 1)
  endif()
  math(EXPR last_shard "${arg_SHARDS} - 1")
  if(arg_PER_SUITE)
    set(add "
  list(FIND added \"\${suite}\" seen)
  if(seen EQUAL -1 AND suite MATCHES \"${arg_SHARD_SUITES}\")
    list(APPEND added \"\${suite}\")
    foreach(shard RANGE ${last_shard})
      add_test(\"${arg_PREFIX}\${suite}/\${shard}\" \"$<TARGET_FILE:${target}>\" \"--gtest_filter=\${suite}.*\")
      set_tests_properties(\"${arg_PREFIX}\${suite}/\${shard}\" PROPERTIES ${shard_properties})
    endforeach()
  elseif(seen EQUAL -1)
    list(APPEND added \"\${suite}\")
    add_test(\"${arg_PREFIX}\${suite}\" \"$<TARGET_FILE:${target}>\" \"--gtest_filter=\${suite}.*\")
    set_tests_properties(\"${arg_PREFIX}\${suite}\" PROPERTIES ${properties})
  endif()")
  else()
    set(add "
  add_test(\"${arg_PREFIX}\${suite}.\${name}\" \"$<TARGET_FILE:${target}>\" \"--gtest_filter=\${suite}.\${name}\")
  set_tests_properties(\"${arg_PREFIX}\${suite}.\${name}\" PROPERTIES ${properties})
  if(suite MATCHES \"${arg_COST_SUITES}\")
    set_tests_properties(\"${arg_PREFIX}\${suite}.\${name}\" PROPERTIES COST ${arg_COST})
  endif()")
  endif()
  file(GENERATE OUTPUT "${script}" CONTENT "
if(NOT EXISTS \"$<TARGET_FILE:${target}>\")
  add_test(\"${arg_PREFIX}${target}_NOT_BUILT\" \"$<TARGET_FILE:${target}>\")
  return()
endif()
execute_process(COMMAND \"$<TARGET_FILE:${target}>\" --gtest_list_tests
                OUTPUT_VARIABLE listing RESULT_VARIABLE listed TIMEOUT 60)
if(NOT listed EQUAL 0)
  add_test(\"${arg_PREFIX}${target}_DISCOVERY_FAILED\" \"$<TARGET_FILE:${target}>\" --gtest_list_tests)
  return()
endif()
string(REPLACE \"\\n\" \";\" lines \"\${listing}\")
set(suite \"\")
set(wanted OFF)
set(added \"\")
foreach(line IN LISTS lines)
  if(line MATCHES \"^([A-Za-z0-9_/]+)\\\\.\")
    set(suite \"\${CMAKE_MATCH_1}\")
    set(wanted OFF)
    if(suite MATCHES \"${arg_SUITE_REGEX}\" AND NOT suite MATCHES \"${arg_EXCLUDE_SUITES}\")
      set(wanted ON)
    endif()
    continue()
  endif()
  if(NOT wanted OR NOT line MATCHES \"^  ([A-Za-z0-9_/]+)\")
    continue()
  endif()
  set(name \"\${CMAKE_MATCH_1}\")${add}
endforeach()
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
endfunction()
