#include "flashcheck/kernels/cpu/plain.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace flashcheck {

bool CpuPlain::sees(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) const {
  const std::int64_t diagonal = i + lk - lq;
  const std::int64_t slack = flaw_ == PlainFlaw::causal_off_by_one ? 1 : 0;
  switch (p.mask) {
    case MaskKind::none: return true;
    case MaskKind::causal_tl: return j <= i + slack;
    case MaskKind::causal_br: return flaw_ == PlainFlaw::bottom_right_as_top_left ? j <= i : j <= diagonal + slack;
    case MaskKind::window: {
      const std::int64_t left = p.window_left + (flaw_ == PlainFlaw::window_off_by_one ? 1 : 0);
      return (p.window_left < 0 || j >= diagonal - left) && (p.window_right < 0 || j <= diagonal + p.window_right);
    }
  }
  return true;
}

namespace {

// bf16 of x rounded toward zero: the nearest bf16, or the next one toward zero
// where the nearest is larger in magnitude. (The earlier form, f32's low 16
// bits masked off with std::bit_cast, behaved as a round to nearest when this
// file was built at -O3 with g++ 12 (here) and 13 (the GPU machine), and
// truncated at -O2 and -O0: the mutant survived in Release builds only. The
// cause was not pinned down; this form truncates at every level.)
double toward_zero_bf16(float x) {
  const double nearest = round_to(DType::bf16, x);
  if (!std::isfinite(x) || std::fabs(nearest) <= std::fabs(static_cast<double>(x))) return nearest;
  const std::uint16_t bits = half_bits_from_double(DType::bf16, nearest);
  return half_bits_to_double(DType::bf16, static_cast<std::uint16_t>(bits - 1));  // sign-magnitude: one step down
}

// The score modifications (Problem::softcap, then Problem::alibi) in f32, this
// kernel's own code: s <- C tanh(s / C), s <- s - slope_h |i + lk - lq - j|.
struct ScoreMod {
  float softcap = 0, slope = 0, scale = 1;
  std::int64_t diagonal_shift = 0;
  PlainFlaw flaw = PlainFlaw::none;
  ScoreMod(const Problem& p, std::int64_t h, std::int64_t lq, std::int64_t lk, PlainFlaw flaw_in)
      : softcap(static_cast<float>(p.softcap)),
        scale(static_cast<float>(p.softmax_scale)),
        diagonal_shift(flaw_in == PlainFlaw::alibi_top_left ? 0 : lk - lq),
        flaw(flaw_in) {
    if (!p.alibi) return;
    const auto heads = static_cast<std::uint64_t>(p.heads_q);
    const auto m = static_cast<std::int64_t>(std::bit_floor(heads));  // the largest power of two <= heads
    slope = h < m ? std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(m))
                  : std::exp2(-4.0f * static_cast<float>(2 * (h - m) + 1) / static_cast<float>(m));
  }
  /// The modified logit; `chain` receives d(modified)/d(s) (1 without a softcap).
  float operator()(float s, std::int64_t i, std::int64_t j, float* chain = nullptr) const {
    float derivative = 1.0f;
    if (softcap > 0 && flaw == PlainFlaw::softcap_before_scale) {  // the flaw: s / scale is q.k
      const float t = std::tanh(s / scale / softcap);
      s = softcap * t * scale;
      derivative = 1.0f - t * t;
    } else if (softcap > 0) {
      const float t = std::tanh(s / softcap);
      s = softcap * t;
      derivative = 1.0f - t * t;
    }
    if (chain) *chain = derivative;
    if (slope != 0) s -= slope * static_cast<float>(std::abs(i + diagonal_shift - j));
    return s;
  }
};

}  // namespace

RunResult CpuPlain::run(const Problem& p, const Inputs& in) {
  if (auto refusal_outside = refuse_outside(capabilities(), p)) return *refusal_outside;
  RunResult result;
  result.outputs = make_outputs(p);
  result.outputs.has_lse = true;
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  const auto scale = static_cast<float>(p.softmax_scale);
  float logit_scale = flaw_ == PlainFlaw::scale_squared ? scale * scale : scale;
  if (flaw_ == PlainFlaw::scale_hardcoded_d64 && p.head_dim == 64) logit_scale = 0.125f;
  const bool truncate_bf16 = flaw_ == PlainFlaw::bf16_truncating_epilogue && p.dtype == DType::bf16;
  std::vector<float> logits(static_cast<std::size_t>(p.seqlen_kv));
  std::vector<float> accumulator(static_cast<std::size_t>(p.head_dim_v));
  // Where key j of sequence b lives: (b, j), or a pool page and slot through the table.
  const PageTable& table = in.pages;
  if (const std::string mismatch = page_table_mismatch(p, table); !mismatch.empty())
    return RunResult{Status::error, "cpu-plain: " + mismatch, {}};
  const auto at = [&](std::int64_t b, std::int64_t j) -> std::pair<std::int64_t, std::int64_t> {
    if (p.page_size == 0) return {b, j};
    const std::int64_t n = j / p.page_size;
    if (flaw_ == PlainFlaw::page_table_ignored) return {(b * table.per_sequence + n) % table.pages, j % p.page_size};
    if (flaw_ == PlainFlaw::page_off_by_one && j % p.page_size == 0 && n > 0) return {table.page(b, n - 1), 0};
    return {table.page(b, n), j % p.page_size};
  };
  // K's element: its value (the stored fp8 value times the descale), or as stored with the flaw.
  const bool k_descale_missing = flaw_ == PlainFlaw::fp8_k_descale_missing;
  const auto key = [&](std::int64_t entry, std::int64_t hk, std::int64_t slot, std::int64_t c) {
    return k_descale_missing ? in.k.stored(in.k.offset(entry, hk, slot, c)) : in.k.get(entry, hk, slot, c);
  };
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        const std::int64_t hk = h / p.group_size(), lq = p.len_q(b), lk = p.len_kv(b);
        const ScoreMod modify(p, h, lq, lk, flaw_);
        float maximum = minus_infinity;
        bool any_key = false;
        for (std::int64_t j = 0; j < lk; ++j) {
          if (!sees(p, i, j, lq, lk)) continue;
          float dot = 0;
          const auto [entry, slot] = at(b, j);
          for (std::int64_t c = 0; c < p.head_dim; ++c)
            dot += static_cast<float>(in.q.get(b, h, i, c)) * static_cast<float>(key(entry, hk, slot, c));
          logits[j] = modify(dot * logit_scale, i, j);
          // NaN-propagating maximum, as the plain formula.
          maximum = std::isnan(logits[j]) || std::isnan(maximum) ? std::numeric_limits<float>::quiet_NaN()
                                                                  : std::max(maximum, logits[j]);
          any_key = true;
        }
        float* lse = &result.outputs.lse[(b * p.heads_q + h) * p.seqlen_q + i];
        if (!any_key) {  // fully masked: O = 0, LSE = -inf
          for (std::int64_t c = 0; c < p.head_dim_v; ++c) result.outputs.o.set(b, h, i, c, 0.0);
          *lse = minus_infinity;
          continue;
        }
        const float shift = flaw_ == PlainFlaw::no_max_subtraction ? 0.0f : maximum;
        float sum = 0;
        std::fill(accumulator.begin(), accumulator.end(), 0.0f);
        for (std::int64_t j = 0; j < lk; ++j) {
          if (!sees(p, i, j, lq, lk)) continue;  // masked keys are absent
          const float weight = std::exp(logits[j] - shift);
          sum += weight;
          const auto [entry, slot] = at(b, j);
          for (std::int64_t c = 0; c < p.head_dim_v; ++c)
            accumulator[c] += weight * static_cast<float>(in.v.get(entry, hk, slot, c));
        }
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const float value = accumulator[c] / sum;
          result.outputs.o.set(b, h, i, c, truncate_bf16 ? toward_zero_bf16(value) : value);
        }
        const float natural = shift + std::log(sum);
        *lse = flaw_ == PlainFlaw::lse_in_log2 ? natural / std::log(2.0f) : natural;
      }
  return result;
}

BackwardResult CpuPlain::run_backward(const Problem& p, const BackwardInputs& in) {
  if (auto refusal = refuse_backward_outside(capabilities(), p)) return *refusal;
  BackwardResult result;
  result.gradients = make_gradients(p);
  const std::int64_t d = p.head_dim, dv = p.head_dim_v, group = p.group_size();
  const float scale = static_cast<float>(p.softmax_scale);
  const float ds_scale = flaw_ == PlainFlaw::bwd_scale_missing_in_ds ? 1.0f : scale;
  std::vector<float> logits(static_cast<std::size_t>(p.seqlen_kv)), chains(logits.size()), dq(static_cast<std::size_t>(d));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      std::vector<float> dk(static_cast<std::size_t>(lk * d), 0.0f), dvs(static_cast<std::size_t>(lk * dv), 0.0f);
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const bool reduce = flaw_ != PlainFlaw::bwd_gqa_not_reduced || h == hk * group;
        const ScoreMod modify(p, h, lq, lk, flaw_);
        for (std::int64_t i = 0; i < lq; ++i) {
          std::fill(dq.begin(), dq.end(), 0.0f);
          float maximum = -std::numeric_limits<float>::infinity();
          bool any_key = false, saw_nan = false;
          for (std::int64_t j = 0; j < lk; ++j) {
            const bool visible = sees(p, i, j, lq, lk);
            if (!visible && flaw_ != PlainFlaw::bwd_masked_keys_in_dk) continue;
            float dot = 0;
            for (std::int64_t c = 0; c < d; ++c)
              dot += static_cast<float>(in.inputs.q.get(b, h, i, c)) * static_cast<float>(in.inputs.k.get(b, hk, j, c));
            logits[j] = modify(dot * scale, i, j, &chains[j]);
            if (!visible) continue;
            saw_nan = saw_nan || std::isnan(logits[j]);
            maximum = std::max(maximum, logits[j]);
            any_key = true;
          }
          if (any_key) {
            if (saw_nan) maximum = std::numeric_limits<float>::quiet_NaN();
            float sum = 0;
            for (std::int64_t j = 0; j < lk; ++j)
              if (sees(p, i, j, lq, lk)) sum += std::exp(logits[j] - maximum);
            // D_i = rowsum(dO_i o O_i), from the O this backward is handed.
            float delta = 0;
            for (std::int64_t c = 0; c < dv; ++c) {
              delta += static_cast<float>(in.dout.get(b, h, i, c)) * static_cast<float>(in.forward.o.get(b, h, i, c));
              if (flaw_ == PlainFlaw::bwd_delta_low_precision) delta = static_cast<float>(round_to(p.dtype, delta));
            }
            for (std::int64_t j = 0; j < lk; ++j) {
              const bool visible = sees(p, i, j, lq, lk);
              if (!visible && flaw_ != PlainFlaw::bwd_masked_keys_in_dk) continue;
              float prob = std::exp(logits[j] - maximum) / sum;
              if (flaw_ == PlainFlaw::bwd_p_flushed && std::fpclassify(prob) == FP_SUBNORMAL) prob = 0.0f;
              float dprob = 0;
              for (std::int64_t c = 0; c < dv; ++c)
                dprob += static_cast<float>(in.dout.get(b, h, i, c)) * static_cast<float>(in.inputs.v.get(b, hk, j, c));
              float dscore = prob * (dprob - delta) * chains[j] * ds_scale;
              float prob_v = prob;
              if (operands_in_dtype_) {  // cpu-plain-tc: the dtype's operands, as a tensor core's
                dscore = static_cast<float>(round_to(p.dtype, prob * (dprob - delta) * chains[j])) * ds_scale;
                prob_v = static_cast<float>(round_to(p.dtype, prob));
              }
              if (reduce)
                for (std::int64_t c = 0; c < d; ++c)
                  dk[j * d + c] += dscore * static_cast<float>(in.inputs.q.get(b, h, i, c));
              if (!visible) continue;  // the flaw adds masked keys into dK only
              for (std::int64_t c = 0; c < d; ++c) dq[c] += dscore * static_cast<float>(in.inputs.k.get(b, hk, j, c));
              if (reduce)
                for (std::int64_t c = 0; c < dv; ++c)
                  dvs[j * dv + c] += prob_v * static_cast<float>(in.dout.get(b, h, i, c));
            }
          }
          if (flaw_ == PlainFlaw::bwd_d256_only_wrong && d == 256) dq[d - 1] = 0.0f;
          for (std::int64_t c = 0; c < d; ++c) result.gradients.dq.set(b, h, i, c, dq[c]);
        }
        for (std::int64_t i = lq; i < p.seqlen_q; ++i)  // padding rows: 0
          for (std::int64_t c = 0; c < d; ++c) result.gradients.dq.set(b, h, i, c, 0.0);
      }
      for (std::int64_t j = 0; j < p.seqlen_kv; ++j) {
        for (std::int64_t c = 0; c < d; ++c) result.gradients.dk.set(b, hk, j, c, j < lk ? dk[j * d + c] : 0.0f);
        for (std::int64_t c = 0; c < dv; ++c) result.gradients.dv.set(b, hk, j, c, j < lk ? dvs[j * dv + c] : 0.0f);
      }
    }
  }
  return result;
}

namespace {
SubjectRegistration<CpuPlain> registration;
struct TensorCoreOperands {
  TensorCoreOperands() {
    Registry::instance().add([] {
      return std::make_unique<CpuPlain>(kCpuPlainTcName,
                                        "cpu-plain with P and dS rounded to the dtype before the backward's products, "
                                        "as tensor-core kernels do",
                                        PlainFlaw::none, /*operands_in_dtype=*/true);
    });
  }
} tensor_core_operands;
}

}  // namespace flashcheck
