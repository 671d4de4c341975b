// The metamorphic properties' testbed, after CUTLASS's
// (test/unit/gemm/device/testbed.h: initialize / run / verify / sufficient()).
//
// A metamorphic property relates a base case to a transformed one. The
// Testbed judges the base case once (the subject, the f64 oracle and the
// same-precision baseline, on every row) and keeps its reference and its rule
// bound. The property then runs the subject alone on the transformed inputs
// and verifies them against the base's reference carried over by the relation
// it states (a permutation of rows, V's affine map, a moved LSE), within a
// bound taken from the base's baseline. Judging the transformed case again
// (a second f64 oracle and baseline) was most of these properties' time.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/tensor.hpp"
#include "flashcheck/core/tolerance.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck {

/// How far each element may be from its reference: on O and on LSE.
struct Tolerance {
  double o = 0, lse = 0;
};
inline Tolerance operator+(const Tolerance& x, const Tolerance& y) { return {x.o + y.o, x.lse + y.lse}; }

class Testbed {
 public:
  explicit Testbed(Subject& subject) : subject_(subject) {}

  /// Whether the subject's domain admits `problem` (CUTLASS's sufficient()).
  bool sufficient(const Problem& problem) const;

  /// Judges the base case once on `inputs`, every row: the subject must pass
  /// the tolerance rule (a relation built on a base that is itself out of
  /// bounds would prove nothing). A refusal at launch discards the case; any
  /// other failure to run fails it.
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

  /// Runs the subject alone (no oracle, no baseline) and returns every row.
  AttentionRows run(const Problem& problem, const Inputs& inputs) const;

  /// Asserts that every element of `got` is within `tolerance` of `want` (both
  /// for `problem`) and that their NaN/Inf classes agree. The failure names
  /// the relation, the problems in `shown` and the first and worst elements.
  void verify(std::string_view relation, const Problem& problem, const AttentionRows& got, const AttentionRows& want,
              const Tolerance& tolerance, const std::vector<const Problem*>& shown) const;
  /// Asserts that `got`, the subject's rows of the base problem on the base
  /// inputs (another configuration of the subject, say), passes the whole rule
  /// (max, RMSE, NaN/Inf census) against the base's reference and baseline.
  void verify_rule(std::string_view what, const AttentionRows& got) const;

  /// The rule's bound for a transformation that changes the baseline's own
  /// arithmetic (K + 1 w^T puts logits near 1e3, which a bf16 baseline rounds
  /// coarsely): the same-precision baseline alone runs on the transformed
  /// inputs and is measured against the derived reference `want`; `condition`
  /// is the transformed case's logit conditioning (bounded from the base's by
  /// the property). No second f64 oracle.
  Tolerance baseline_bound(const Problem& problem, const Inputs& inputs, const AttentionRows& want,
                           const AttentionRows& condition) const;

 private:
  Subject& subject_;
  Inputs inputs_;
  CaseResult base_;
  AttentionRows outputs_;
};

// ---- tensor transforms ------------------------------------------------------
// Along the sequence axis of [batch, heads, seq, dim] tensors and of
// AttentionRows holding every row (all_rows).

/// Per (batch entry, head), a permutation of its first order[b][h].size() rows.
using RowOrder = std::vector<std::vector<std::vector<std::int64_t>>>;

/// A uniformly random permutation, per head, of the first lengths[b] rows of
/// each batch entry, drawn with *rc::gen (so that it shrinks and replays).
RowOrder draw_row_order(const std::vector<std::int64_t>& lengths, std::int64_t heads);
/// Row s of (b, h) of the result is row order[b][h][s] of `t` (rows past
/// order[b][h] are copied as they are).
HostTensor permute_rows(const HostTensor& t, const RowOrder& order);
AttentionRows permute_rows(const AttentionRows& rows, const RowOrder& order);
/// Rows [first, first + count) of every (b, h).
HostTensor slice_rows(const HostTensor& t, std::int64_t first, std::int64_t count);
/// Each head `times` times: head h of the result is head h / times of `t`.
HostTensor repeat_heads(const HostTensor& t, std::int64_t times);
/// Batch entry b alone (batch 1), its first `length` rows.
HostTensor batch_entry(const HostTensor& t, std::int64_t b, std::int64_t length);
/// Batch entry b of `rows` (of `problem`) as the rows of `entry`, the
/// single-sequence problem of that entry (first entry.seqlen_q rows).
AttentionRows batch_entry(const AttentionRows& rows, std::int64_t b, const Problem& entry);
/// Rows [first, first + entry.seqlen_q) of every (b, h) of `rows`, as the rows of `entry`.
AttentionRows row_window(const AttentionRows& rows, std::int64_t first, const Problem& entry);
/// Applies f to every element of `t`.
template <typename F>
HostTensor map_elements(const HostTensor& t, F f) {
  HostTensor out = t;
  for (std::int64_t n = 0; n < t.size(); ++n) out.store(n, f(t.load(n)));
  return out;
}

}  // namespace flashcheck
