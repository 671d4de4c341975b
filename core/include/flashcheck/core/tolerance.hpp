// The tolerance rule: measured, never guessed.
//
// A case passes when, against the f64 oracle, for O's max and RMSE error (and
// LSE's, when the subject writes LSE):
//     err(subject) <= kBaselineFactor * err(same-precision baseline) + floor
//     floor = noise_floor(output rounding) + logit_noise(logit conditioning)
// and the NaN/Inf classes agree position by position.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

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

/// Absolute noise floor for errors of values of magnitude `scale` stored in
/// dtype: kFloorRoundings roundings, each at most max(u |x|, s / 2) with s the
/// dtype's smallest subnormal (a rounding's error is relative only in the
/// normal range; below it the grid's spacing is s whatever the size). Measured
/// (CI, 2026-11-26): cpu-plain's LseMergeOfKeyHalves on bf16 `values=subnormal()`
/// with scale=16, O near -1.1e-39, where each half's bf16 O rounds to a grid of
/// 9.2e-41: the merge was 2.3e-41 off against a relative floor of 1.7e-41.
double noise_floor(DType dtype, double scale);

/// The second part of the floor: the rounding noise every implementation has
/// in its logits. Kernels compute each logit as a d-term f32 dot product, whose
/// rounding error is, typically, sqrt(d) f32 roundings of the logit's absolute
/// condition a_j = scale sum_c |q_c k_jc| (Higham & Mary, "A new approach to
/// probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019).
/// Through the softmax, a logit error da_j moves O[c] by p_j (V[j,c] - O[c]) da_j
/// and LSE by p_j da_j. This floor allows kLogitRoundings such roundings.
///
/// Why it exists (a change to DESIGN.md's constant floor): with f32 data, when
/// one large logit dominates the error (an outlier, a dominant key), the
/// subject's and the baseline's errors are each essentially one rounding of
/// that logit, and the ratio of two such draws exceeds 2 about 30% of the time:
/// the constant floor made the rule fail correct f32 kernels at random
/// (measured: cpu-plain, a textbook f32 kernel, at ratio 1.13 and 1.17 on
/// outlier cases). In f16/bf16 the baseline's own rounding of S and P to half
/// precision dominates and this term rarely matters.
inline constexpr double kLogitRoundings = 2.0;

/// The third part of the floor: the rounding of the two sums a row
/// accumulates in f32 over its keys, l = sum_j e_j and sum_j e_j V_j (or the
/// weighted sum of V). Recursive summation of n terms carries, typically,
/// sqrt(n) f32 roundings of the largest partial sum (Higham & Mary, as above),
/// so O moves by up to sqrt(n) u_f32 max|V| and LSE, through log l, by
/// sqrt(n) u_f32. Every implementation carries it, the baseline included, and
/// the ratio of two such draws passes 2 at random once it dominates.
/// Measured (issue 20, 2026-11-25): cpu-plain, a textbook f32 kernel, failed
/// on `b=1 hq=4 hkv=1 sq=1 skv=1023 d=1 dtype=f32 values=normal(-1.7,0.1)` at
/// 4.7 x the baseline's O error (3.2e-6, ~0.8 sqrt(n) u |O|); fa2-rowthread on
/// an H100 at LSE 4.9e-7 over 2 x baseline + floor = 4.5e-7. It does not hide
/// the mma kernels' 131072-key LSE drift (3.5e-4 against 2.2e-4 + 4.3e-5).
inline constexpr double kAccumulationRoundings = 2.0;

/// The logits' conditioning in one case, from the f64 oracle
/// (AttentionRows::o_condition and lse_condition over the compared rows).
struct LogitCondition {
  std::int64_t head_dim = 1;
  /// Unit roundoff of the rounding the subject applies to its inputs before the
  /// products: 0 when it computes in its storage dtype; u(f16) for a kernel
  /// that stores f32 but computes in f16. Rounding q and k relatively by u moves
  /// each logit by at most 2u a_j, deterministically (no sqrt(d)).
  double input_unit = 0;
  /// The unit of the subject's S = Q K^T accumulation where it is coarser
  /// than f32's (Capabilities::product_accumulation_unit; 0: f32): each of
  /// the ceil(d / kProductStepK) steps of the product may move a logit by
  /// up to this unit of a_j, deterministically (truncation, not a random walk).
  double product_unit = 0;
  double o_max = 0, o_rms = 0;      // per element: sum_j p_j a_j (|V[j,c]| + |O[c]|)
  double lse_max = 0, lse_rms = 0;  // per row: sum_j p_j a_j
  /// The accumulation term's scales: sqrt(keys the longest compared row sees)
  /// times max |V| (finite), for O; sqrt(those keys), for LSE.
  double accumulation_o = 0, accumulation_lse = 0;
  friend bool operator==(const LogitCondition&, const LogitCondition&) = default;
};

/// The accumulation noise for a scale: kAccumulationRoundings u_f32 scale.
double accumulation_noise(double scale);

/// The k of one step of a tensor core's product whose accumulation is coarser
/// than f32 (Hopper's fp8 wgmma: m64nNk32).
inline constexpr double kProductStepK = 32;

/// The logit noise for a condition value, O's:
/// kLogitRoundings (u_f32 sqrt(d) + 2 input_unit + ceil(d / kProductStepK) product_unit) condition.
/// A coarse product accumulation (LogitCondition::product_unit) moves the
/// logits of a row alike (truncation), which a softmax is blind to: O sees
/// the steps' differences, ceil(d / 32) units of a_j.
double logit_noise(const LogitCondition& condition, double value);
/// LSE's: logit_noise plus the common shift of a row's logits that LSE takes
/// in full: each of the d products truncated when it is aligned to its step's
/// largest, kLogitRoundings (d - ceil(d / kProductStepK)) product_unit more.
/// Measured on an H100 (2026-11-27, hopper-fp8 and cudnn-fp8 at d = 128):
/// LSE errors up to 1.1e-3 of a_j where one product dominates
/// (values=dominant: 1.07e-2 on an LSE of 9.9), about 2^-13 to 2^-11.5 of it
/// otherwise; this term allows 2 x 124 x 2^-13 = 3.0e-2 of a_j.
double lse_logit_noise(const LogitCondition& condition, double value);

/// The bias check ("o.bias"): a systematic error that the maximum and RMSE
/// checks let through. A bf16 epilogue that truncates (rounds toward zero)
/// instead of rounding to nearest at most doubles the max error, which fits
/// under kBaselineFactor x baseline + floor; its mean signed error moves by
/// about half an output ulp per element (measured on an H100 in issue 20: the
/// t statistic from -1.7 to -512), while a round-to-nearest output's errors
/// have mean 0. The check fails when both hold:
///  - the bias is significant: |t| > kBiasT, t = mean_signed / (s / sqrt(n))
///    over the n compared elements of O (ErrorStats::bias_t), and n >=
///    kBiasMinCount, so that t has a sample behind it;
///  - it is larger than the baseline's own bias and the output rounding explain:
///      |mean_signed(subject) - rounding_mean| > kBaselineFactor |mean_signed(baseline)| + bias_floor,
///      the subject's mean error measured from what a correctly rounded output
///      has on the same references (ErrorStats::rounding_mean). The baseline's
///      stays unshifted: its arithmetic spreads its outputs before they round
///      (H200 case below: mean -1.2e-5 against rounding_mean 2.9e-3), and
///      shifting it would widen the bound by 2 x rounding_mean, enough to let a
///      truncating output (one ulp, 7.8e-3 there) through.
///      Why: references crowded around one value (a long row's O tends to
///      mean(V)) all round the same way, so a correctly rounded output has a
///      mean error up to half an ulp and an unbounded t; the unshifted rule
///      failed it (BiasRuleTest.CorrectRoundingOfCrowdedReferencesIsNotABias).
///      Measured, it is not what the H200 sweep of 2026-11-26 found: on `b=1
///      hq=2 hkv=1 sq=1 skv=262144 d=128 bf16 mask=window window=-1,3
///      values=normal(-1.7,0.8)` rounding_mean was -4.2e-5, and the mma
///      kernels, hopper and cuDNN (err/err(cuDNN) = 1.00) still fail o.bias
///      with a mean error of 2.93e-3 (0.38 bf16 ulp, t = 20, ratio 1.32) where
///      decode and splitkv, whose P stays f32, have 0: a finding about rounding
///      the unnormalised P to bf16 before P V on long rows, not a false alarm
///      bias_floor = kBiasFloorRoundings max(u(out) rms(ref), s(out)) + logit_noise(o_rms)
///                   + accumulation_noise(accumulation_o) + tie_slack
///    where s(out) is the dtype's smallest subnormal: the output grid's spacing
///    wherever the outputs are subnormal, whatever their size (measured on an
///    H100: warp-rows, correctly rounded, on f32 `values=subnormal()` outputs
///    near 2e-39 had a mean signed error of 0.19 of that spacing at t = 10.3,
///    which u(out) rms(ref) = 1e-46 called a bias)
///    and tie_slack (ErrorStats::tie_slack) is the mean over elements of
///    an ulp for each reference within kTieBand ulp of a rounding midpoint:
///    there a kernel's sub-ulp arithmetic decides the side, and a consistent
///    side is no rounding bias. Measured on an H100 (2026-11-27, gpu tier,
///    Gpu_hopper.LseMergeOfKeyHalves): `b=1 hq=1 hkv=1 sq=2 skv=2 d=128
///    dtype=bf16 softcap=5 values=normal(-1.7,0.1)`. The cap saturates, both
///    weights are 1 in bf16 while the row sum keeps 0.99999, so O is each
///    column's two-value average times 1 + 5e-6. That average is a bf16
///    midpoint for 61% of the columns, and hopper's output rounded all of them
///    away from zero: a mean error of -2.38e-3 (t = -18.7) against a floor of
///    1.81e-3, with O within half an ulp everywhere. The baseline normalises P
///    before rounding it, and its ties round to even.
///    The slack is small where references are spread out (random references
///    fall in the band 3% of the time); a truncating output still fails where
///    fewer than about half the elements are ties.
///    The factor is the rule's own (a kernel may be twice as biased as plain
///    attention in its precision: the baseline rounds S and P to the working
///    dtype, and round-to-nearest of the same values can carry a bias of
///    either sign when the values repeat).
///
/// A second mean is recorded but not judged: ErrorStats::mean_magnitude, of
/// (got - ref) sign(ref). A truncating epilogue's is -(0.5 to 1) u |ref|
/// whatever the outputs' signs, where the signed mean of outputs centred on 0
/// cancels. Judged by the same rule it was tried and taken out (2026-11-25):
/// it failed a correct cpu-plain case in the 1000-case property run
/// (`b=2 hq=8 hkv=1 sq=1023 skv=16 lens_q=1023,4 lens_kv=16,2 d=10 bf16
/// mask=window window=3,3 values=offset(-1000) dseed=39315`: mean 2.3e-4,
/// t = 8.3, ratio 1.12, outputs growing away from zero). The truncating
/// mutants are caught by o.bias (cpu-plain's after 15 cases, mma's after 3;
/// cpu-plain's had survived on the H100 machine only because its mask behaved
/// as a round to nearest at -O3, kernels/cpu/plain.cpp).
///
/// The floor carries the f32 accumulation term of the max and RMSE floors: a
/// long row's sums carry one error that every query row sharing its keys
/// repeats (a decode batch, MQA), which their mean does not average away. In
/// a sweep on the H100 (2026-11-25), mma-ldmatrix-x4 on `b=1 hq=8 hkv=1 sq=4
/// skv=32768 d=64 f16 values=normal(-0.8,1)` had a mean error of 1.04e-4 at
/// t = 34 (outputs shrinking toward zero: tensor-core f32 accumulation),
/// ratio 0.90 without the term and 0.45 with it (accumulation_o = 992).
inline constexpr double kBiasT = 8.0;
/// Why 8 and not the 4 of metrics.hpp's comment: the t statistic assumes
/// independent errors, and a correct kernel's errors are not: the rows of a
/// head share K and V, a dominant key makes rows nearly equal, a row's
/// normalisation error is common to its columns, and values that repeat round
/// the same way. So t alone cannot decide: in a 5-minute CPU sweep
/// (`flashcheck fuzz --subjects all --minutes 5 --seed 22`, 10927 cpu-plain
/// cases), 111 correct cpu-plain cases had |t| > 8, some infinite (identical
/// errors). The magnitude test below is the guard that does not depend on
/// independence: those 111 stayed at or below 0.49 of its bound, and no correct
/// case's o.bias ratio passed 0.53 (the truncating mutant is caught at 1.7).
inline constexpr std::int64_t kBiasMinCount = 32;
/// A round-to-nearest output has |mean error| <= u |ref| only when every
/// element's error has the same sign and half an ulp (values that repeat); for
/// independent errors the mean is ~u rms(ref) / sqrt(3 n), far below. A
/// truncating output's mean error is (0.5 to 1) u |mean(ref)| (half an ulp,
/// which is u to 2u relative), so a quarter of u rms(ref) separates the two
/// wherever the outputs lean to one sign (V's +0.5 offset makes them lean).
inline constexpr double kBiasFloorRoundings = 0.25;

/// One inequality of the rule.
struct RuleCheck {
  std::string metric;  // "o.max_abs", "o.rmse", "lse.max_abs", "lse.rmse", "o.bias"
  double subject = 0;
  double baseline = 0;
  double floor = 0;
  double bound = 0;    // kBaselineFactor * baseline + floor
  double ratio = 0;    // subject / bound (<= 1 passes); for o.bias, min(that, |t| / kBiasT)
  bool pass = true;
  friend bool operator==(const RuleCheck&, const RuleCheck&) = default;
};

struct Verdict {
  bool pass = true;
  std::string rule;  // the check that decided, in words
  std::vector<RuleCheck> checks;
  bool census_pass = true;
  /// The largest subject/bound ratio over the checks.
  double worst_ratio = 0;
  friend bool operator==(const Verdict&, const Verdict&) = default;
};

/// The bounds the rule implies for a case, before the subject's metrics exist
/// (for counting elements over the bound).
Bounds rule_bounds(const CaseMetrics& baseline, DType out_dtype, const LogitCondition& condition = {});

/// Applies the rule to a subject's and the baseline's metrics (both against the
/// f64 oracle). Without a LogitCondition the floor is the output rounding alone.
Verdict decide(const CaseMetrics& subject, const CaseMetrics& baseline, DType out_dtype,
               const LogitCondition& condition = {});

// ---- the backward's rule ---------------------------------------------------
//
// For dQ, dK and dV, max and RMSE error against the f64 gradient oracle:
//     err(subject) <= kGradientBaselineFactor * err(baseline) + floor
// and the NaN/Inf classes agree position by position. The baseline is
// cpu_lowp's backward (oracles/cpu_lowp.hpp): autograd through plain attention
// in the working dtype, as PyTorch's math backend computes it.

/// k_g: flash-attention's own gradient criterion, the forward's factor:
/// tests/test_flash_attn.py asserts
///   (dq - dq_ref).abs().max() <= 2 * (dq_pt - dq_ref).abs().max()
/// (the same for dk and dv), dq_ref from the upcast reference and dq_pt from
/// plain attention in the working dtype; its hopper/ tests add the floor below.
inline constexpr double kGradientBaselineFactor = 2.0;

/// The gradients' floor, per gradient g:
///   kFloorRoundings u(out) max|g_ref|            (the output's own rounding,
///     hopper/test_flash_attn.py's dq_atol = 2 * (dq_ref + 0.3 - 0.3 - dq_ref).abs().max())
/// + kAccumulationRoundings u_f32 sqrt(n_g) max(max|g_ref|, T_g)
///   T_g is the gradient's magnitude before its sums cancel (GradientRows::
///   dq_terms_max, dk_terms_max, dv_terms_max). The f32 sums behind each
///   element carry typically sqrt(n) f32 roundings of their largest partial
///   sum (Higham & Mary 2019), and a partial sum of dS = P (dP - D) is as
///   large as its terms, not as its result: where dO is nearly the same over
///   the keys, dP is close to D and the gradient cancels to a small value
///   while its roundings stay those of the terms (a fuzz sweep of the CPU
///   subjects failed dQ at ratios up to 2.4 with max|g_ref| alone).
///   n_dQ = the keys the longest compared row sees; n_dK = n_dV = the query
///   rows, over the GQA group, that the most-seen key is seen by.
/// + kLogitRoundings u_f32 X_g (GradientRows::dq_logit_terms_max ...): each
///   P_ij = exp(S_ij - LSE_i) is computed from an f32 logit and an LSE handed
///   in f32, and moves by about u_f32 e_ij P_ij, e_ij = sqrt(d) times the
///   logit's condition plus the row's mean of those plus |LSE_i| (the
///   forward's logit term, P-weighted so that a one-hot row, whose P no
///   rounding moves, adds nothing).
/// + the handed O's rounding, through D, for dQ and dK: a subject forms
///   D_i = rowsum(dO_i o O_i) from the O it is handed, rounded to the dtype
///   (core/backward.hpp's convention, and what FlashAttention's backward
///   does), so D_i is off by dD_i = dO_i . (O_handed,i - O_i), which the
///   baseline (D from its own P and dP) does not see. It moves dQ_i by
///   -scale dD_i sum_j P_ij K_j and dK_j by -scale sum_i P_ij dD_i Q_i:
///     dq_delta = scale max|K| max_i |dD_i|
///     dk_delta = scale max|Q| max_i |dD_i| max_j sum_i P_ij
///   (bounds, computed by the judge from the exact and the handed O; a fuzz
///   sweep of cpu-plain failed dQ at f16 where dQ cancels, ratio 1.01,
///   before this term).
/// + operand_roundoff (T_g + delta_g), for a subject that rounds P and dS to
///   the working dtype before its products (Capabilities::
///   backward_operands_in_dtype; 0 for one with f32 operands): each term
///   P_ij dO_i, dS_ij K_j, dS_ij Q_i then carries one rounding of that dtype,
///   at most u_w times the sum of the terms' magnitudes, T_g, plus the part
///   of dS that the handed O's rounding adds (delta_g). The baseline rounds
///   the same operands, so its error usually covers this; where every value
///   is exact in the dtype (values=ties) the baseline's P and dS are exact and
///   its error 0, while a subject handed an f32 LSE has a P off by u_f32, a
///   dS that no longer cancels exactly, and the dtype's rounding of each dS:
///   flashcheck's cuDNN graph (cuDNN 9.14), fa2-mma-bwd and a CPU emulation
///   (cpu-plain-tc) gave the same dQ error, 1.00 to 1.40 times the floor
///   without this term, on an H100 (2026-11-26), where fa2-rowthread-bwd (f32
///   operands) stays at 0.93.
struct GradientCondition {
  double dq_terms = 1, dkv_terms = 1;
  /// From the f64 oracle's gradients (GradientRows), 0 where not known.
  double dq_terms_max = 0, dk_terms_max = 0, dv_terms_max = 0;
  double dq_logit_terms_max = 0, dk_logit_terms_max = 0, dv_logit_terms_max = 0;
  /// The handed O's rounding through D (absolute), 0 where not known.
  double dq_delta = 0, dk_delta = 0;
  /// u of the dtype the subject rounds P and dS to before its products (0:
  /// f32 operands, whose roundings the accumulation term already counts).
  double operand_roundoff = 0;
  friend bool operator==(const GradientCondition&, const GradientCondition&) = default;
};

/// The terms each gradient element of a problem sums, from its masks and lengths.
GradientCondition gradient_condition(const Problem& problem);
/// The same, with the magnitudes the f64 oracle recorded in `reference`.
GradientCondition gradient_condition(const Problem& problem, const GradientRows& reference);
/// The same, with the handed O's rounding through D: `exact` is the f64
/// forward on every row (its O before rounding), `handed` what the subject was
/// handed (backward_outputs), `inputs` Q, K, V and `dout` dO.
GradientCondition gradient_condition(const Problem& problem, const GradientRows& reference, const AttentionRows& exact,
                                     const Outputs& handed, const Inputs& inputs, const HostTensor& dout);

/// Applies the backward's rule; checks are named dq.max_abs, dq.rmse, dk.*, dv.*.
Verdict decide_gradients(const GradientMetrics& subject, const GradientMetrics& baseline, DType out_dtype,
                         const GradientCondition& condition);

}  // namespace flashcheck
