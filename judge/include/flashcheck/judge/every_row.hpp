// The every-row reference of a GPU case: kokkos_f64 on the device over every
// query row (and, for pass=bwd, the gradients on every query and key row),
// and cpu_f64 on sampled rows cross-checking it. Large problems are otherwise
// checked on sampled rows only (cpu_f64 runs on the host).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck {

/// How far two references apart are on the rows of `sampled` (a subset of
/// `every`'s rows): O normwise (||a - b|| / ||b||), the worst LSE difference
/// relative to 1 + |LSE|, and the positions where one is non-finite and the
/// other differs.
struct CrossCheck {
  double o_normwise = 0, lse_relative = 0;
  std::int64_t nonfinite_mismatches = 0;
  /// Two f64 references agree to f64 rounding: 1e-12, the bound of the
  /// triangulation property CpuF64AgreesWithKokkosToOneInATrillion.
  bool agrees() const { return o_normwise <= 1e-12 && lse_relative <= 1e-12 && nonfinite_mismatches == 0; }
};

CrossCheck cross_check(const Problem& problem, const AttentionRows& every, const AttentionRows& sampled);

/// kokkos_f64 on the GPU over every row, and its cross-check against
/// `cpu_sampled` (cpu_f64 on some rows of the same inputs).
struct EveryRowReference {
  AttentionRows rows;
  CrossCheck check;
};

/// std::nullopt where the device reference cannot run here (no CUDA Kokkos
/// built in, or no GPU).
std::optional<EveryRowReference> every_row_reference(const Problem& problem, const Inputs& inputs,
                                                     const AttentionRows& cpu_sampled);

/// Judges a case again on every query row, where the judge checked a sample:
/// kokkos_f64 is the reference and kokkos_baseline the same-precision baseline,
/// both in `space` (the GPU in production; the host runs the same code, for
/// tests), and cpu_f64's sampled rows (`sampled_reference`, the judge's
/// reference) must agree with kokkos_f64 on those rows, or the case fails with
/// a rule that says the oracles disagree (its rows then stay the sample). The
/// logit conditioning of the floor stays the sample's (cpu_f64 computes it);
/// the accumulation scales are those of every row. A failure of the rule on
/// every row is a deviation where the sampled one was, or where
/// `declared_limit` (declared_deviation of the case) says so. Where given,
/// `every_reference` receives kokkos_f64 on every row. Returns false, leaving
/// `result` as it was, where the sample already was every row, the case did
/// not run, or `space` cannot run here (KokkosSpace::device without a CUDA
/// Kokkos or a GPU).
///
/// The judge calls it with JudgeOptions::every_row (oracles/judge.hpp).
bool judge_every_row(CaseResult& result, const Inputs& inputs, const Outputs& subject_outputs,
                     const AttentionRows& sampled_reference, KokkosSpace space = KokkosSpace::device,
                     const std::optional<std::string>& declared_limit = std::nullopt,
                     AttentionRows* every_reference = nullptr);

/// How far two gradient references are apart on the rows of `sampled` (dQ on
/// its query rows, dK and dV on its key rows, subsets of `every`'s): per
/// gradient the normwise difference ||a - b|| against what two f64
/// computations of it may differ by, and the positions where one is
/// non-finite and the other differs.
struct GradientCrossCheck {
  double worst_ratio = 0;     // the largest ||a - b|| / allowed over dQ, dK, dV
  const char* worst = "dq";   // the gradient of worst_ratio
  double worst_normwise = 0;  // its ||a - b|| / ||b||
  std::int64_t nonfinite_mismatches = 0;
  bool agrees() const { return worst_ratio <= 1 && nonfinite_mismatches == 0; }
};

/// The allowed difference of a gradient g is 1e-12 (||g|| + sqrt(N) (W_g + X_g)):
/// the forward's one-in-a-trillion agreement, plus the same share of the
/// gradient's terms before they cancel (W_g, X_g: GradientCondition's
/// *_terms_max and *_logit_terms_max, per element, over N compared elements),
/// for a gradient that is small because dS = P (dP - D) cancels and whose f64
/// value is rounding noise of its terms.
GradientCrossCheck cross_check_gradients(const Problem& problem, const GradientRows& every, const GradientRows& sampled,
                                         const GradientCondition& condition);

/// The backward twin of judge_every_row: judges a pass=bwd case again on every
/// query row (dQ) and every key row (dK, dV), where the judge checked a
/// sample. kokkos_gradients (Algorithm 2 in f64, with the conditioning) is the
/// reference and kokkos_gradient_baseline the same-precision baseline, both in
/// `space`; cpu_f64's sampled gradients (`sampled_reference`) must agree with
/// the reference on their rows (cross_check_gradients), or the case fails with
/// a rule that says the oracles disagree. The conditioning of the floor is
/// that of every row: the reference's terms, and the handed O's rounding
/// through D from `exact_forward` (cpu_f64's forward on every row) and
/// `handed_forward` (what the subject was handed). The verdict's kind follows
/// judge_every_row's. Returns false, leaving `result` as it was, where the
/// sample already was every row, the case did not run, or `space` cannot run
/// here.
bool judge_every_row_gradients(CaseResult& result, const Inputs& inputs, const HostTensor& dout,
                               const Gradients& subject_gradients, const GradientRows& sampled_reference,
                               const AttentionRows& exact_forward, const Outputs& handed_forward,
                               KokkosSpace space = KokkosSpace::device,
                               const std::optional<std::string>& declared_limit = std::nullopt,
                               GradientRows* every_reference = nullptr);

}  // namespace flashcheck
