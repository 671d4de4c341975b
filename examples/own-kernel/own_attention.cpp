#include "own_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace own_kernel {

namespace {

/// Whether query row i sees key j (the problem's padded lengths sq, skv):
/// causal_tl aligns the diagonal top-left (j <= i), causal_br bottom-right
/// (j <= i + skv - sq).
bool sees(flashcheck::MaskKind mask, std::int64_t i, std::int64_t j, std::int64_t sq, std::int64_t skv) {
  switch (mask) {
    case flashcheck::MaskKind::causal_tl: return j <= i;
    case flashcheck::MaskKind::causal_br: return j <= i + skv - sq;
    default: return true;
  }
}

}  // namespace

flashcheck::RunResult OwnAttention::run(const flashcheck::Problem& p, const flashcheck::Inputs& in) {
  // Outside the declared domain: unsupported, nothing touched.
  if (auto refusal = flashcheck::refuse_outside(capabilities(), p)) return *refusal;
  flashcheck::RunResult result;
  result.outputs = flashcheck::make_outputs(p);
  result.outputs.has_lse = true;
  const float scale = static_cast<float>(flaw_ == Flaw::scale_applied_twice ? p.softmax_scale * p.softmax_scale
                                                                            : p.softmax_scale);
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  std::vector<float> logits(static_cast<std::size_t>(p.seqlen_kv));
  std::vector<float> accumulator(static_cast<std::size_t>(p.head_dim_v));
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t h_kv = h / p.group_size();  // GQA: query heads share a K/V head
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        float row_max = minus_infinity;
        bool any_key = false;
        for (std::int64_t j = 0; j < p.seqlen_kv; ++j) {
          if (!sees(p.mask, i, j, p.seqlen_q, p.seqlen_kv)) continue;
          float dot = 0;
          for (std::int64_t c = 0; c < p.head_dim; ++c)
            dot += static_cast<float>(in.q.get(b, h, i, c)) * static_cast<float>(in.k.get(b, h_kv, j, c));
          logits[j] = dot * scale;
          row_max = std::isnan(logits[j]) || std::isnan(row_max) ? logits[j] + row_max : std::max(row_max, logits[j]);
          any_key = true;
        }
        float& lse = result.outputs.lse[static_cast<std::size_t>((b * p.heads_q + h) * p.seqlen_q + i)];
        if (!any_key) {  // a row that sees no key: O = 0, LSE = -inf (flashcheck's convention)
          for (std::int64_t c = 0; c < p.head_dim_v; ++c) result.outputs.o.set(b, h, i, c, 0.0);
          lse = minus_infinity;
          continue;
        }
        float sum = 0;
        std::fill(accumulator.begin(), accumulator.end(), 0.0f);
        for (std::int64_t j = 0; j < p.seqlen_kv; ++j) {
          if (!sees(p.mask, i, j, p.seqlen_q, p.seqlen_kv)) continue;
          const float weight = std::exp(logits[j] - row_max);
          sum += weight;
          for (std::int64_t c = 0; c < p.head_dim_v; ++c)
            accumulator[c] += weight * static_cast<float>(in.v.get(b, h_kv, j, c));
        }
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) result.outputs.o.set(b, h, i, c, accumulator[c] / sum);
        lse = row_max + std::log(sum);
      }
    }
  return result;
}

}  // namespace own_kernel
