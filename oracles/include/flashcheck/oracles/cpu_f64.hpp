// cpu_f64: the float64 oracle.
//
// Plain two-pass softmax attention in double. The two products go through BLAS
// dgemm, blocked over query rows so that memory stays bounded; the blocks run in
// parallel (OpenMP) with single-threaded BLAS. Masks are implemented here from
// the Problem spec, on their own: nothing is shared with kernels/.
//
// Non-finite inputs follow IEEE arithmetic through the plain formula (a NaN
// logit makes its row NaN); masked keys are absent, never multiplied by zero.
#pragma once

#include "flashcheck/core/oracle.hpp"

namespace flashcheck {

/// The cpu_f64 reference of the given rows. With `with_condition`, it also
/// fills AttentionRows::lse_condition and o_condition (two more products: about
/// twice the time, and |K|, |V| copies in memory), which the tolerance rule's
/// noise floor uses.
AttentionRows cpu_f64_reference(const Problem& problem, const Inputs& inputs, const RowSet& rows,
                                bool with_condition = false);

class CpuF64 final : public Oracle {
 public:
  std::string_view name() const override { return "cpu_f64"; }
  AttentionRows reference(const Problem& problem, const Inputs& inputs, const RowSet& rows) override {
    return cpu_f64_reference(problem, inputs, rows);
  }
};



}  // namespace flashcheck
