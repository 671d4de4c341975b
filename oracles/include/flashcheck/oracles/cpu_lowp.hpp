// cpu_lowp: the same-precision baseline of the tolerance rule.
//
// Plain attention in a working dtype, rounding after each step as a framework
// would: S = round(scale * Q K^T) with each dot product accumulated in f32,
// softmax in f32, P = round(softmax), O = round(P V) with P V accumulated in f32,
// LSE = max + log(sum) in f32. In f32 it is plain f32 attention.
//
// Every sum runs in the textbook order (index by index, one rounding per
// product and per addition): the plain order is the reference a kernel must not
// be much worse than. (A first version used sgemm, whose blocked FMA
// accumulation is about 3x more accurate in f32 than a textbook dot product:
// that made the tolerance rule fail a correct f32 kernel that sums in order.)
//
// Registered also as the smoke test `smoke-cpu-lowp`, so the whole pipeline
// runs without a GPU. Judged, it is its own baseline (every ratio 0.50 by
// construction), so it cannot fail on accuracy: it is not in `all`, and
// `cpu-plain` is the CPU control subject. Its masks are its own code,
// separate from cpu_f64's.
#pragma once

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

/// The baseline's O and LSE for the given rows, computed in `working` precision
/// (inputs are rounded to it first when the storage dtype is wider). An fp8
/// working dtype (fp8 inputs only) keeps S in f32 and rounds the unnormalized
/// P = exp(S - max) to the format before P V, O then in bf16: fp8 attention
/// as FlashAttention-3 and cuDNN compute it (cpu_lowp.cpp).
AttentionRows cpu_lowp_rows(const Problem& problem, const Inputs& inputs, const RowSet& rows, DType working);

/// O rounded as a subject that declares Capabilities::fp8_output writes it:
/// each element to the fp8 format `fp8` at V's descale, round(O / descale)
/// x descale (exact in f64). Applied to the baseline's rows for such a
/// subject, after output_dtype's rounding (a framework's fp8 O quantizes its
/// bf16 O).
void round_o_to_fp8(AttentionRows& rows, DType fp8, double descale);
/// Whether a case's baseline rounds O so: the subject declares fp8_output and
/// the problem's inputs are fp8.
inline bool baseline_o_in_fp8(const Capabilities& caps, const Problem& problem) {
  return caps.fp8_output && is_fp8(problem.dtype);
}

/// The baseline's gradients: dQ on `q_rows`, dK and dV on `kv_rows`, as a
/// framework's math backend computes them in `working` precision (autograd
/// through S = (Q K^T) scale, P = softmax(S), O = P V, rounding after each
/// node): P recomputed as the forward baseline does; dP = round(dO V^T);
/// dS = round(P (dP - D)) with D_i = sum_j P_ij dP_ij in f32 (the softmax's
/// backward); dS' = round(scale dS); dQ = round(dS' K), dK = round(dS'^T Q),
/// dV = round(P^T dO), every product accumulated in f32 in index order. For
/// GQA, each query head's dK and dV are rounded, then summed over the group
/// in f32 and rounded once (the backward of repeating K and V). Its masks
/// are this file's own code; the O and LSE the subject is handed are not used.
GradientRows cpu_lowp_gradients(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                                const RowSet& q_rows, const RowSet& kv_rows, DType working);

/// Domain of the smoke-cpu-lowp smoke test: everything the vocabulary can express.
inline constexpr Capabilities kCpuLowpCapabilities = {
    .dtypes = {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2},
    .min_head_dim = 1,
    .max_head_dim = 576,
    .max_head_dim_v = 512,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    .lse = true,
};

class CpuLowp : public Subject {
 public:
  std::string_view name() const override { return "smoke-cpu-lowp"; }
  std::string_view description() const override {
    return "pipeline smoke test: the same-precision baseline judged against itself (CPU; cannot fail on accuracy)";
  }
  const Capabilities& capabilities() const override { return kCpuLowpCapabilities; }
  RunResult run(const Problem& problem, const Inputs& inputs) override;
};

}  // namespace flashcheck
