// A planted violation for the layers check (properties/CMakeLists.txt: layers_catch_a_forbidden_include).
#include "flashcheck/oracles/reference.hpp"
