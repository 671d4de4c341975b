// The tolerance rule: measured, never guessed.
//
// A case passes when, against the f64 oracle, for O's max and RMSE error (and
// LSE's, when the subject writes LSE):
//     err(subject) <= kBaselineFactor * err(same-precision baseline) + noise_floor
// and the NaN/Inf classes agree position by position.
#pragma once

#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/metrics.hpp"

namespace flashcheck {

/// k: a kernel may be at most twice as far from the exact result as plain
/// attention computed in the same precision. This is flash-attention's own test
/// criterion: tests/test_flash_attn.py asserts
///   (out - out_ref).abs().max() <= 2 * (out_pt - out_ref).abs().max()
/// with out_ref in higher precision and out_pt plain attention in the working dtype.
inline constexpr double kBaselineFactor = 2.0;

/// The noise floor, in roundings of the output dtype at the reference's scale:
/// flash-attention's hopper/test_flash_attn.py adds
///   fwd_atol = 2 * (out_ref + 0.3 - 0.3 - out_ref).abs().max()
/// i.e. two output roundings, so that a baseline that happens to be exact (small
/// integer inputs, one-hot softmax) does not demand an exact kernel.
inline constexpr double kFloorRoundings = 2.0;

/// Absolute noise floor for errors of values of magnitude `scale` stored in dtype.
double noise_floor(DType dtype, double scale);

/// One inequality of the rule.
struct RuleCheck {
  std::string metric;  // "o.max_abs", "o.rmse", "lse.max_abs", "lse.rmse"
  double subject = 0;
  double baseline = 0;
  double floor = 0;
  double bound = 0;    // kBaselineFactor * baseline + floor
  double ratio = 0;    // subject / bound (<= 1 passes)
  bool pass = true;
};

struct Verdict {
  bool pass = true;
  std::string rule;  // the check that decided, in words
  std::vector<RuleCheck> checks;
  bool census_pass = true;
  /// The largest subject/bound ratio over the checks.
  double worst_ratio = 0;
};

/// The bounds the rule implies for a case, before the subject's metrics exist
/// (for counting elements over the bound).
Bounds rule_bounds(const CaseMetrics& baseline, DType out_dtype);

/// Applies the rule to a subject's and the baseline's metrics (both against the f64 oracle).
Verdict decide(const CaseMetrics& subject, const CaseMetrics& baseline, DType out_dtype);

}  // namespace flashcheck
