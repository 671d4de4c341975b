// The properties' testbed, after CUTLASS's (test/unit/gemm/device/testbed.h:
// initialize / run / verify / sufficient()).
//
// A metamorphic property relates a base case to a transformed one. The
// Testbed draws the base case inside the subject's domain (draw), judges it
// once (initialize: the subject, the f64 oracle and the same-precision
// baseline on every row; the oracle and baseline come from the process's
// ReferenceCache, so that a base judged again costs no second oracle) and
// keeps its reference and its rule bound (bound). The property then runs the
// subject alone on the transformed inputs (run) and verifies the result
// against the base's reference carried over by the relation it states
// (relations.hpp), within a bound taken from the base's baseline (verify).
//
// Every check fails the property with RC_FAIL (a RapidCheck property body),
// naming the relation, the problems, the first and worst elements, and the
// base case's replay command; a refusal at launch discards the case.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/tensor.hpp"
#include "flashcheck/generators/generators.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/testing/relations.hpp"
#include "flashcheck/testing/transforms.hpp"

namespace flashcheck::testing {

/// How far each element may be from its reference: on O and on LSE.
struct Tolerance {
  double o = 0, lse = 0;
};
inline Tolerance operator+(const Tolerance& x, const Tolerance& y) { return {x.o + y.o, x.lse + y.lse}; }

class Testbed {
 public:
  explicit Testbed(Subject& subject) : subject_(subject) {}

  Subject& subject() const { return subject_; }
  const Capabilities& capabilities() const { return subject_.capabilities(); }

  // ---- drawing ----------------------------------------------------------------
  /// Problems inside the subject's domain, each with a row that sees a key.
  rc::Gen<Problem> problems(DomainLimits limits = {}) const;
  /// A problem from `problems` that the domain admits, that compares something
  /// (a row that sees a key) and that `accept` takes, filtered in the
  /// generator (rc::gen::suchThat) so that it counts toward the budget only
  /// when it tests something; tags its coverage (tag) and compared_rows.
  Problem draw(const rc::Gen<Problem>& problems, const std::function<bool(const Problem&)>& accept = {}) const;
  /// Tags the case per dimension: dtype, mask, d, gqa, len_q, len_kv (classes
  /// relative to the domain's tiles), padded.
  void tag(const Problem& problem) const;

  /// Whether the subject's domain admits `problem` (CUTLASS's sufficient()).
  bool sufficient(const Problem& problem) const;

  // ---- the base case --------------------------------------------------------------
  /// Judges the base case once, every row: the subject must pass the tolerance
  /// rule (a relation built on a base that is itself out of bounds would prove
  /// nothing). The inputs are the problem's own (generate_inputs) unless given.
  void initialize(const Problem& problem);
  void initialize(const Problem& problem, const Inputs& inputs);

  const Problem& problem() const { return base_.problem; }
  const Inputs& inputs() const { return inputs_; }
  const CaseResult& base() const { return base_; }
  /// The f64 oracle's rows of the base case, with their logit conditioning.
  const AttentionRows& reference() const { return base_.reference; }
  /// The subject's rows of the base case.
  const AttentionRows& outputs() const { return outputs_; }
  /// The rule's bound on the base case (k x baseline + floor), per element.
  Tolerance bound() const;

  /// No vacuous pass (CUTLASS's EXPECT_GT(TensorNorm, 0)): the base inputs
  /// are non-zero (or hold a NaN/Inf) wherever the problem has valid rows.
  bool inputs_nonzero() const;
  /// Whether some valid row of the base reference is finite (LSE and every O).
  bool reference_has_finite_row() const;
  /// The base output and its reference are not all zero.
  bool outputs_nonzero() const;

  // ---- running ---------------------------------------------------------------------
  /// Runs the subject alone (no oracle, no baseline): every row.
  AttentionRows run(const Problem& problem, const Inputs& inputs) const;
  /// Runs the subject alone: its outputs as returned, padding included.
  Outputs call(const Problem& problem, const Inputs& inputs) const;

  // ---- verifying -------------------------------------------------------------------
  /// Every valid element of `got` within `tolerance` of `want` (both of
  /// `problem`), and their NaN/Inf classes equal position by position.
  void verify(std::string_view relation, const Problem& problem, const AttentionRows& got, const AttentionRows& want,
              const Tolerance& tolerance, const std::vector<const Problem*>& shown) const;
  /// Every valid element of O of `got` inside [interval.lo, interval.hi].
  void verify_inside(std::string_view relation, const Problem& problem, const AttentionRows& got,
                     const Interval& interval) const;
  /// The rows that `keep(b, h, i)` selects (valid rows only) bitwise equal in
  /// O and LSE (a NaN equals a NaN in O). Returns how many of them see a key:
  /// a comparison of fully masked rows alone tests nothing.
  std::int64_t verify_bitwise(std::string_view relation, const Problem& problem, const AttentionRows& got,
                              const AttentionRows& want,
                              const std::function<bool(std::int64_t b, std::int64_t h, std::int64_t i)>& keep) const;
  /// `got`, the subject's rows of the base problem on the base inputs (in
  /// another configuration, say), passes the whole rule (max, RMSE, NaN/Inf
  /// census) against the base's reference and baseline.
  void verify_rule(std::string_view what, const AttentionRows& got) const;

  /// The rule's bound for a transformation that changes the baseline's own
  /// arithmetic (K + 1 w^T puts logits near 1e3, which a bf16 baseline rounds
  /// coarsely): the same-precision baseline alone runs on the transformed
  /// inputs and is measured against the derived reference `want`, whose
  /// conditions give the logit conditioning. No second f64 oracle.
  Tolerance baseline_bound(const Problem& problem, const Inputs& inputs, const AttentionRows& want) const;

 private:
  std::string shown_lines(const std::vector<const Problem*>& shown) const;

  Subject& subject_;
  Inputs inputs_;
  CaseResult base_;
  AttentionRows outputs_;
};

}  // namespace flashcheck::testing
