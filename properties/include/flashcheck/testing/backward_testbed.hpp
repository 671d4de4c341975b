// The backward pass's testbed: the Testbed (testbed.hpp) for pass=bwd
// problems. A backward metamorphic property relates a base case to a
// transformed one, as the forward's do: the base is drawn inside the
// subject's domain (pass=bwd, DomainLimits::backward), judged once
// (initialize: judge_backward on every query and key row, which must pass:
// a relation built on a base out of bounds proves nothing), and the subject
// alone runs on the transformed inputs (run: handed the f64 oracle's O and
// LSE of those inputs, core/backward.hpp's convention), its gradients
// verified against the base's, moved by the relation, within a bound taken
// from the rule (bound, baseline_bound).
//
// Every check fails the property with RC_FAIL, naming the relation, the
// gradient, the element, the problems and the base case's replay command; a
// refusal at launch discards the case.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/generators/generators.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/testing/testbed.hpp"
#include "flashcheck/testing/transforms.hpp"

namespace flashcheck::testing {

/// How far each gradient element may be from its reference.
struct GradientTolerance {
  double dq = 0, dk = 0, dv = 0;
};
inline GradientTolerance operator+(const GradientTolerance& x, const GradientTolerance& y) {
  return {x.dq + y.dq, x.dk + y.dk, x.dv + y.dv};
}
inline GradientTolerance operator*(double factor, const GradientTolerance& x) {
  return {factor * x.dq, factor * x.dk, factor * x.dv};
}

/// The work limit of a backward property's problems (B Hq Sq Skv (d + dv)
/// multiply-adds of the forward; the backward case costs about 6 of those:
/// the f64 forward handed over, the subject's backward (2.5), the f64
/// gradients and the baseline's): a tenth of the forward properties'
/// default, so that a backward property costs what a forward one does.
inline constexpr double kBackwardMaxWork = 2e6;

class BackwardTestbed {
 public:
  explicit BackwardTestbed(Subject& subject) : forward_(subject) {}

  Subject& subject() const { return forward_.subject(); }
  const Capabilities& capabilities() const { return forward_.capabilities(); }

  // ---- drawing ----------------------------------------------------------------
  /// pass=bwd problems inside the subject's domain (DomainLimits::backward),
  /// within kBackwardMaxWork unless `limits` says less.
  rc::Gen<Problem> problems(DomainLimits limits = {}) const;
  /// As Testbed::draw: a problem the domain admits that compares something and
  /// that `accept` takes, its coverage tagged.
  Problem draw(const rc::Gen<Problem>& problems, const std::function<bool(const Problem&)>& accept = {}) const;
  bool sufficient(const Problem& problem) const { return forward_.sufficient(problem); }

  // ---- the base case --------------------------------------------------------------
  /// Judges the base case on every query and key row (judge_backward): it must
  /// pass the backward rule. Inputs and dO are the problem's own unless given.
  void initialize(const Problem& problem);
  void initialize(const Problem& problem, const Inputs& inputs, const HostTensor& dout);

  const Problem& problem() const { return base_.problem; }
  const Inputs& inputs() const { return inputs_; }
  const HostTensor& dout() const { return dout_; }
  const CaseResult& base() const { return base_; }
  /// The f64 gradient oracle's rows of the base case (every row).
  const GradientRows& reference() const { return base_.gradient_reference; }
  /// The subject's gradients of the base case: as returned, and on every row.
  const Gradients& gradients() const { return base_.gradients; }
  const GradientRows& rows() const { return rows_; }
  /// The rule's max bound on the base case (k_g x baseline + floor) per gradient.
  GradientTolerance bound() const;

  // ---- running ---------------------------------------------------------------------
  /// What a subject is handed for (problem, inputs): the f64 oracle's O and LSE
  /// on every row (from the ReferenceCache), rounded (backward_outputs).
  Outputs handed(const Problem& problem, const Inputs& inputs) const;
  /// Runs the subject's backward alone (no gradient oracle, no baseline).
  Gradients call(const Problem& problem, const Inputs& inputs, const HostTensor& dout) const;
  Gradients call(const Problem& problem, const BackwardInputs& handed) const;
  /// The same, on every query and key row.
  GradientRows run(const Problem& problem, const Inputs& inputs, const HostTensor& dout) const;

  // ---- verifying -------------------------------------------------------------------
  /// Every valid element of each gradient of `got` within its tolerance of
  /// `want` (both of `problem`, every row), and their NaN/Inf classes equal.
  void verify(std::string_view relation, const Problem& problem, const GradientRows& got, const GradientRows& want,
              const GradientTolerance& tolerance, const std::vector<const Problem*>& shown) const;
  /// The same with a tolerance per element (gradient_error_bounds' rows).
  void verify(std::string_view relation, const Problem& problem, const GradientRows& got, const GradientRows& want,
              const GradientRows& tolerance, const std::vector<const Problem*>& shown) const;
  /// The dQ rows `keep_q(b, h, i)` selects and the dK/dV rows `keep_kv(b, hk, j)`
  /// selects (valid rows only) bitwise equal (a NaN equals a NaN). Returns how
  /// many dQ rows that see a key and dK/dV rows that some query sees it compared.
  std::int64_t verify_bitwise(std::string_view relation, const Problem& problem, const GradientRows& got,
                              const GradientRows& want,
                              const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_q,
                              const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_kv) const;
  /// The same rows within `tolerance` per element (and their NaN/Inf classes
  /// equal): what two calls of a subject whose backward is not declared
  /// deterministic (dQ added by atomics, in another order each call) can be
  /// held to, the two runs' derived bounds summed.
  std::int64_t verify_rows_within(std::string_view relation, const Problem& problem, const GradientRows& got,
                                  const GradientRows& want, const GradientRows& tolerance,
                                  const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_q,
                                  const std::function<bool(std::int64_t, std::int64_t, std::int64_t)>& keep_kv) const;

  /// The rule's max bound (k_g x baseline + floor) for a transformed case: the
  /// same-precision baseline's gradients `baseline` (computed on the
  /// transformed inputs and moved into `frame`, the problem both are rows of)
  /// measured against the derived reference `want`. No second gradient oracle.
  GradientTolerance baseline_bound(const Problem& frame, const GradientRows& baseline, const GradientRows& want) const;
  /// The same-precision baseline's gradients (cpu_lowp, in the base's working
  /// dtype) on every row of (problem, inputs, dout).
  GradientRows baseline(const Problem& problem, const Inputs& inputs, const HostTensor& dout) const;

  /// The problem lines and the base's replay command, for a failure message.
  std::string shown_lines(const std::vector<const Problem*>& shown) const;

 private:
  Testbed forward_;
  Inputs inputs_;
  HostTensor dout_;
  CaseResult base_;
  GradientRows rows_;
};

// ---- gradient rows moved by a relation ------------------------------------------

/// Every query and key row of a problem.
GradientRows all_gradient_rows(const Problem& problem);
/// The key rows of (b, hk) permuted: row s of the result is row order[b][hk][s]
/// of `rows` (RowOrder of transforms.hpp, over the K/V heads); dQ unchanged.
GradientRows permute_key_rows(const GradientRows& rows, const RowOrder& order);
/// Batch entry b of `rows` (every row) as the rows of `entry`, its single-sequence problem.
GradientRows gradient_entry(const GradientRows& rows, std::int64_t b, const Problem& entry);
/// MHA gradients of `mha` (K/V repeated per query head) as the rows of `gqa`:
/// dQ as it is, dK and dV summed over each group's query heads in f64.
GradientRows sum_over_groups(const GradientRows& mha, const Problem& gqa);

// ---- the column sums' identities -------------------------------------------------

/// One column of one (batch, K/V head): the subject's sum over the valid key
/// rows, the value the exact arithmetic gives, and the bound derived for
/// their difference (backward_testbed.cpp, gradient_sums).
struct ColumnSum {
  std::int64_t b = 0, hk = 0, column = 0;
  double got = 0, want = 0, bound = 0;
};
struct GradientSums {
  std::vector<ColumnSum> dk, dv;
  /// The largest relative error the bound allows each P_ij (how far it is from
  /// the f32 regime: large where logits of 1e3 and more meet an f32 LSE).
  double largest_p_error = 0;
};
/// Sum_j dK_j and Sum_j dV_j of a subject's gradients `got` on (problem,
/// inputs, dout), with `exact` the f64 oracle's forward on every row and
/// `handed` what the subject was handed; `working` the precision the
/// subject's intermediates may be rounded to. The derivation is at the
/// definition.
GradientSums gradient_sums(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                           const AttentionRows& exact, const Outputs& handed, const Gradients& got, DType working);

/// Per element, a bound on how far a subject's gradients `got` on (problem,
/// inputs, dout) may be from the exact gradients, from the roundings a
/// subject may make (gradient_sums' derivation, element by element rather
/// than summed over the keys, with the handed O's rounding D~_i - D_i counted
/// as an error of dS): what the relations between two runs of a subject
/// allow, the sum of the two runs' bounds, with no tolerance rule and no
/// gradient oracle. Padding rows and fully masked rows get 0.
/// Each f32 intermediate may underflow by up to f32's smallest normal (a
/// flush to zero) unless `gradual_underflow`: then by half its smallest
/// subnormal, as IEEE arithmetic without -ftz does (the subnormal weights'
/// property holds subjects to that).
GradientRows gradient_error_bounds(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                                   const AttentionRows& exact, const Outputs& handed, const Gradients& got,
                                   DType working, bool gradual_underflow = false);

/// The smallest non-zero magnitude, in f64, of the terms a backward sums (P dO,
/// dO V, dO O, scale P (dP - D) Q and K) over the visible pairs of
/// (problem, inputs, dout); +inf when there is none. Below 2^-100, some term
/// can round in f32's subnormal range, where scaling by a power of two is not
/// exact (the linearity property).
double smallest_backward_term(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                              const AttentionRows& exact, const Outputs& handed);

}  // namespace flashcheck::testing
