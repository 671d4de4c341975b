// Attention at 256 bits with MPFR, for checking the f64 oracles' own accuracy
// on small problems. Plain two-pass formula; every operation rounds to 256 bits,
// so the result is exact to far below f64 resolution.
#pragma once

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

inline constexpr int kMpfrBits = 256;

/// Whether this build has MPFR.
bool mpfr_available();

/// O and LSE for every row, rounded to f64 at the end. Also returns, per row
/// and column, sum_j p_j |V[j, c]| (the condition of the weighted sum), for
/// the error bound. Throws std::runtime_error without MPFR.
struct MpfrAttention {
  AttentionRows rows;
  std::vector<double> abs_weighted;  // [b][h][row][c], like rows.o
};
MpfrAttention mpfr_attention(const Problem& problem, const Inputs& inputs);

}  // namespace flashcheck
