// Milliseconds since a steady-clock time point: the judge's timings (a private
// header of judge/, shared by judge.cpp and every_row.cpp, which a unity build
// compiles as one unit).
#pragma once

#include <chrono>

namespace flashcheck::judge_detail {

inline double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace flashcheck::judge_detail
