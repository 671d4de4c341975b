#include "flashcheck/kernels/cpu/fa2_tiles.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace flashcheck {
namespace {

constexpr std::int64_t kTile = 16;  // Br = Bc
constexpr float kLog2e = 1.4426950408889634f;

// Whether query i sees key j (this kernel's own mask code).
bool visible(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) {
  const std::int64_t diagonal = i + lk - lq;
  switch (p.mask) {
    case MaskKind::none: return true;
    case MaskKind::causal_tl: return j <= i;
    case MaskKind::causal_br: return j <= diagonal;
    case MaskKind::window:
      return (p.window_left < 0 || j >= diagonal - p.window_left) && (p.window_right < 0 || j <= diagonal + p.window_right);
  }
  return true;
}

// The score modifications on a scaled logit of (i, j), in f32 (this kernel's
// own code): C tanh(s / C), then ALiBi's -slope_h |i + lk - lq - j|;
// `chain` receives d(modified)/d(s).
struct Modify {
  float softcap = 0, slope = 0;
  std::int64_t shift = 0;
  Modify(const Problem& p, std::int64_t h, std::int64_t lq, std::int64_t lk)
      : softcap(static_cast<float>(p.softcap)), shift(lk - lq) {
    if (!p.alibi) return;
    std::int64_t m = 1;  // the largest power of two <= heads_q
    while (m * 2 <= p.heads_q) m *= 2;
    slope = static_cast<float>(h < m ? std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(m))
                                     : std::exp2(-4.0 * static_cast<double>(2 * (h - m) + 1) / static_cast<double>(m)));
  }
  bool active() const { return softcap > 0 || slope != 0; }
  float operator()(float s, std::int64_t i, std::int64_t j, float* chain = nullptr) const {
    if (chain) *chain = 1.0f;
    if (softcap > 0) {
      const float t = std::tanh(s / softcap);
      s = softcap * t;
      if (chain) *chain = 1.0f - t * t;
    }
    if (slope != 0) s -= slope * static_cast<float>(std::abs(i + shift - j));
    return s;
  }
};

// A tile of rows [first, first + kTile) of (b, h) as f32, rows past `valid` filled with `pad`.
void load_tile(const HostTensor& t, std::int64_t b, std::int64_t h, std::int64_t first, std::int64_t valid,
               std::vector<float>& tile, float pad) {
  const std::int64_t dim = t.dim();
  tile.assign(static_cast<std::size_t>(kTile * dim), pad);
  for (std::int64_t r = 0; r < kTile && first + r < valid; ++r) t.read_row(b, h, first + r, tile.data() + r * dim);
}

// A tile of keys [first, first + kTile) of sequence b and K/V head hk, as
// load_tile's, each row read from its pool page and slot when K/V are paged.
void load_key_tile(const HostTensor& t, const PageTable& pages, std::int64_t b, std::int64_t hk, std::int64_t first,
                   std::int64_t valid, std::vector<float>& tile) {
  if (!pages.paged()) return load_tile(t, b, hk, first, valid, tile, 0.0f);
  const std::int64_t dim = t.dim();
  tile.assign(static_cast<std::size_t>(kTile * dim), 0.0f);
  for (std::int64_t r = 0; r < kTile && first + r < valid; ++r)
    t.read_row(pages.page_of(b, first + r), hk, pages.slot_of(first + r), tile.data() + r * dim);
}

}  // namespace

RunResult CpuFa2Tiles::run(const Problem& p, const Inputs& in) {
  if (auto refusal = refuse_outside(capabilities(), p)) return *refusal;
  if (const std::string mismatch = page_table_mismatch(p, in.pages); !mismatch.empty())
    return RunResult{Status::error, "cpu-fa2-tiles: " + mismatch, {}};
  RunResult result;
  result.outputs = make_outputs(p);
  result.outputs.has_lse = true;
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  const auto scale = static_cast<float>(p.softmax_scale);
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  std::vector<float> q, k, v, o(static_cast<std::size_t>(kTile * dv));
  std::vector<float> m(kTile), l(kTile), s(kTile * kTile);
  std::vector<bool> started(kTile), seen_key(kTile), flat(kTile);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size();
      const Modify modify(p, h, lq, lk);
      for (std::int64_t i0 = 0; i0 < p.seqlen_q; i0 += kTile) {
        load_tile(in.q, b, h, i0, lq, q, 0.0f);
        std::fill(m.begin(), m.end(), minus_infinity);
        std::fill(l.begin(), l.end(), 0.0f);
        std::fill(o.begin(), o.end(), 0.0f);
        std::fill(started.begin(), started.end(), false);
        std::fill(flat.begin(), flat.end(), false);
        for (std::int64_t j0 = 0; j0 < lk; j0 += kTile) {
          load_key_tile(in.k, in.pages, b, hk, j0, lk, k);
          load_key_tile(in.v, in.pages, b, hk, j0, lk, v);
          for (std::int64_t r = 0; r < kTile; ++r) {
            const std::int64_t i = i0 + r;
            if (i >= lq) break;
            float tile_max = minus_infinity;
            bool nan = false, any = false;
            for (std::int64_t c = 0; c < kTile; ++c) {
              const std::int64_t j = j0 + c;
              seen_key[c] = j < lk && visible(p, i, j, lq, lk);  // masked keys are absent, never 0 x V
              if (!seen_key[c]) continue;
              float dot = 0;
              for (std::int64_t x = 0; x < d; ++x) dot += q[r * d + x] * k[c * d + x];
              s[r * kTile + c] = modify.active() ? modify(dot * scale, i, j) : dot * scale;
              nan = nan || std::isnan(s[r * kTile + c]);
              tile_max = std::max(tile_max, s[r * kTile + c]);
              any = true;
            }
            if (!any) continue;  // this tile is masked for the row: its state stays
            if (nan) tile_max = std::numeric_limits<float>::quiet_NaN();  // std::max drops a NaN
            // Every visible key so far scores -inf: each weighs exp(-inf - m) = 0 beside
            // a finite maximum seen later (exp(-inf - -inf) would be NaN), yet adds
            // 0 x V to O as the one-pass formula does: NaN where V is infinite. Only a
            // row whose every visible key scores -inf is NaN: `flat` remembers it.
            if (tile_max == minus_infinity && !started[r]) {
              flat[r] = true;
              for (std::int64_t c = 0; c < kTile; ++c)
                if (seen_key[c])
                  for (std::int64_t x = 0; x < dv; ++x) o[r * dv + x] += 0.0f * v[c * dv + x];
              continue;
            }
            const float m_new = std::isnan(tile_max) || std::isnan(m[r]) ? tile_max + m[r] : std::max(m[r], tile_max);
            // The first tile a row sees has nothing to correct (0 x -inf would be NaN).
            const float correction = started[r] ? std::exp(m[r] - m_new) : 0.0f;
            float row_sum = 0;
            for (std::int64_t x = 0; x < dv; ++x) o[r * dv + x] *= correction;
            for (std::int64_t c = 0; c < kTile; ++c) {
              if (!seen_key[c]) continue;
              const float weight = std::exp(s[r * kTile + c] - m_new);
              row_sum += weight;
              for (std::int64_t x = 0; x < dv; ++x) o[r * dv + x] += weight * v[c * dv + x];
            }
            l[r] = correction * l[r] + row_sum;
            m[r] = m_new;
            started[r] = true;
          }
        }
        for (std::int64_t r = 0; r < kTile && i0 + r < p.seqlen_q; ++r) {
          const std::int64_t i = i0 + r;
          const bool seen = i < lq && started[r];
          const bool all_minus_infinity = i < lq && !started[r] && flat[r];
          const float nan = std::numeric_limits<float>::quiet_NaN();
          const float absent = all_minus_infinity ? nan : 0.0f;
          for (std::int64_t x = 0; x < dv; ++x) result.outputs.o.set(b, h, i, x, seen ? o[r * dv + x] / l[r] : absent);
          result.outputs.lse[(b * p.heads_q + h) * p.seqlen_q + i] =
              seen ? m[r] + std::log(l[r]) : all_minus_infinity ? nan : minus_infinity;
        }
      }
    }
  }
  return result;
}

BackwardResult CpuFa2Tiles::run_backward(const Problem& p, const BackwardInputs& in) {
  if (auto refusal = refuse_backward_outside(capabilities(), p)) return *refusal;
  BackwardResult result;
  result.gradients = make_gradients(p);
  const std::int64_t d = p.head_dim, dv = p.head_dim_v, group = p.group_size();
  const auto scale = static_cast<float>(p.softmax_scale);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const bool nan_tail = flaw_ == TileFlaw::nan_at_non_tile_lengths;
  std::vector<float> q, k, v, o, dout, dk(static_cast<std::size_t>(kTile * d)), dvs(static_cast<std::size_t>(kTile * dv));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    // D_i = rowsum(dO_i o O_i), the preprocessing pass; dQ accumulated in f32.
    std::vector<float> delta(static_cast<std::size_t>(p.heads_q * lq), 0.0f);
    std::vector<float> dq(static_cast<std::size_t>(p.heads_q * lq * d), 0.0f);
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < lq; ++i)
        for (std::int64_t x = 0; x < dv; ++x)
          delta[h * lq + i] += static_cast<float>(in.dout.get(b, h, i, x)) * static_cast<float>(in.forward.o.get(b, h, i, x));
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      for (std::int64_t j = lk; j < p.seqlen_kv; ++j) {  // padding rows: 0
        for (std::int64_t x = 0; x < d; ++x) result.gradients.dk.set(b, hk, j, x, 0.0);
        for (std::int64_t x = 0; x < dv; ++x) result.gradients.dv.set(b, hk, j, x, 0.0);
      }
      for (std::int64_t j0 = 0; j0 < p.seqlen_kv; j0 += kTile) {  // key tiles outer
        // The flaw reads the tile's rows past the sequence as they are: NaN.
        if (j0 >= lk) break;  // past the sequence: dK and dV stay 0 (written below)
        load_tile(in.inputs.k, b, hk, j0, lk, k, 0.0f);
        load_tile(in.inputs.v, b, hk, j0, lk, v, 0.0f);
        if (nan_tail)
          for (std::int64_t c = 0; c < kTile; ++c)
            if (j0 + c >= lk)
              for (std::int64_t x = 0; x < d; ++x) k[c * d + x] = nan;
        std::fill(dk.begin(), dk.end(), 0.0f);
        std::fill(dvs.begin(), dvs.end(), 0.0f);
        for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          const Modify modify(p, h, lq, lk);
          for (std::int64_t i0 = 0; i0 < lq; i0 += kTile) {  // query tiles inner
            load_tile(in.inputs.q, b, h, i0, lq, q, 0.0f);
            load_tile(in.dout, b, h, i0, lq, dout, 0.0f);
            for (std::int64_t r = 0; r < kTile && i0 + r < lq; ++r) {
              const std::int64_t i = i0 + r;
              const float lse = in.forward.lse[(b * p.heads_q + h) * p.seqlen_q + i];
              if (lse == -std::numeric_limits<float>::infinity()) continue;  // fully masked: no gradient
              for (std::int64_t c = 0; c < kTile; ++c) {
                const std::int64_t j = j0 + c;
                const bool inside = j < lk || nan_tail;  // the flaw: the whole last tile, unmasked
                if (!inside || (j < lk && !visible(p, i, j, lq, lk))) continue;
                float dot = 0;
                for (std::int64_t x = 0; x < d; ++x) dot += q[r * d + x] * k[c * d + x];
                float chain = 1.0f;
                const float logit = modify.active() ? modify(dot * scale, i, j, &chain) : dot * scale;
                const float prob = flaw_ == TileFlaw::lse_wrong_base ? std::exp2(logit * kLog2e - lse)
                                                                     : std::exp(logit - lse);
                float dprob = 0;
                for (std::int64_t x = 0; x < dv; ++x) dprob += dout[r * dv + x] * v[c * dv + x];
                const float dscore = prob * (dprob - delta[h * lq + i]) * chain;
                for (std::int64_t x = 0; x < dv; ++x) dvs[c * dv + x] += prob * dout[r * dv + x];
                for (std::int64_t x = 0; x < d; ++x) {
                  dk[c * d + x] += scale * dscore * q[r * d + x];
                  dq[(h * lq + i) * d + x] += scale * dscore * k[c * d + x];
                }
              }
            }
          }
        }
        for (std::int64_t c = 0; c < kTile && j0 + c < lk; ++c) {
          for (std::int64_t x = 0; x < d; ++x) result.gradients.dk.set(b, hk, j0 + c, x, dk[c * d + x]);
          for (std::int64_t x = 0; x < dv; ++x) result.gradients.dv.set(b, hk, j0 + c, x, dvs[c * dv + x]);
        }
      }
    }
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q; ++i)
        for (std::int64_t x = 0; x < d; ++x) result.gradients.dq.set(b, h, i, x, i < lq ? dq[(h * lq + i) * d + x] : 0.0f);
  }
  return result;
}

namespace {
SubjectRegistration<CpuFa2Tiles> registration;
}

}  // namespace flashcheck
