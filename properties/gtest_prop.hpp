// RC_GTEST_PROP for properties that need an optional dependency: when the
// dependency is absent the test is reported SKIPPED (never passed).
#pragma once

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

/// Like RC_GTEST_PROP(Suite, Name, ArgList), but skipped with `why` unless `condition`.
#define FLASHCHECK_PROP_IF(condition, why, Suite, Name, ArgList)          \
  void flashcheck_prop_##Suite##_##Name ArgList;                          \
  TEST(Suite, Name) {                                                     \
    if (!(condition)) GTEST_SKIP() << why;                                \
    ::rc::detail::checkGTest(&flashcheck_prop_##Suite##_##Name);          \
  }                                                                       \
  void flashcheck_prop_##Suite##_##Name ArgList
