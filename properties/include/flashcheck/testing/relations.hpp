// What attention's algebra says about a transformed case, given the base
// case's results: the derived references that metamorphic properties verify
// against (a moved LSE, an affine map of O, a merge through LSE, the hull of
// the values a row sees). Each works on AttentionRows holding every row, and
// carries the f64 oracle's logit conditioning along where the relation
// changes it, so that the tolerance rule's floor follows.
#pragma once

#include <cstdint>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck::testing {

/// K -> K + 1 w^T moves row i's logits by scale q_i . w, which softmax
/// ignores: O is unchanged and LSE moves by exactly that. The result is
/// `rows` (of `problem`, on `inputs`) with LSE moved, and, where `rows`
/// carries conditions, the conditioning grown by the shift's worst case: with
/// s_i = scale sum_c |q_ic w_c|, the per-row condition by s_i and the
/// per-element one by s_i (max_j |V_jc| + |O_c|) (the weights do not change).
/// Fully masked rows stay as they are. `largest_shift` is max_i |scale q_i . w|.
struct KeyShift {
  AttentionRows rows;
  double largest_shift = 0;
};
KeyShift shift_keys(const Problem& problem, const Inputs& inputs, const AttentionRows& rows,
                    const std::vector<double>& w);

/// V -> aV + b: the weights sum to one, so O -> aO + b on every row that sees
/// a key, and LSE is unchanged. Conditions, where `rows` carries them:
/// sum_j p_j a_j (|V_jc| + |O_c|) becomes at most |a| times itself plus
/// 2 |b| times the per-row condition.
AttentionRows map_values(const Problem& problem, const AttentionRows& rows, double a, double b);

/// Two results over disjoint halves of the keys merged through their LSE, in
/// f64: L = log(e^La + e^Lb), O = e^(La - L) Oa + e^(Lb - L) Ob.
/// `weight_sensitivity` is max over elements of wa wb |Oa - Ob|: how far an
/// LSE error of one half moves the merged O (dO/dLa = wa wb (Oa - Ob)).
struct Merged {
  AttentionRows rows;
  double weight_sensitivity = 0;
};
Merged merge_by_lse(const Problem& problem, const AttentionRows& first, const AttentionRows& second);

/// Per element of O, the interval [lo, hi] an output may take if it is a
/// convex combination of the values its row sees: V as the subject sees it
/// (rounded to `work`, and with subnormals as 0 too where it may flush them),
/// widened by (n + 2) `rounding_units` max(|lo|, |hi|) for a row that sees n
/// keys. A row that sees no key gets [0, 0]. LSE is not bounded (both -inf, +inf).
struct Interval {
  AttentionRows lo, hi;
};
Interval value_hull(const Problem& problem, const HostTensor& v, DType work, bool may_flush_subnormals,
                    double rounding_units);

/// The result every valid row of a problem with no visible key must give:
/// O = 0 and LSE = -inf (the one convention).
AttentionRows fully_masked(const Problem& problem);

}  // namespace flashcheck::testing
