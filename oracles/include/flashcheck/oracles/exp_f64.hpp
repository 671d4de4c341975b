// exp over the softmax's domain, vectorized, for the f64 oracle.
//
// The oracle takes exp(s - max) of every visible logit: 268M of them for one
// B=1, H=16, N=M=4096 problem, which a scalar libm exp makes as costly as both
// products together. This is a correctly scaled, vectorizable exp with about
// 1 ULP of error (tested against std::exp); NaN, -Inf and underflow follow IEEE.
#pragma once

#include <cstdint>

namespace flashcheck {

/// x[i] = exp(x[i]) for i in [0, n).
void exp_in_place(double* x, std::int64_t n);

/// x[i] = exp(x[i] - shift) for i in [0, n); returns the sum of the new x[i]
/// (summed in index order). One pass over x, chunk by chunk in L1.
double exp_shifted_sum(double* x, std::int64_t n, double shift);

}  // namespace flashcheck
