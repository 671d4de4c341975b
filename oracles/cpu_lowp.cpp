#include "flashcheck/oracles/cpu_lowp.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "flashcheck/oracles/blas.hpp"

namespace flashcheck {
namespace {

float round_float(DType working, float x) {
  if (working == DType::f32) return x;
  if (working == DType::bf16) return round_to_bf16(x);
  return static_cast<float>(round_to(working, x));
}

// The keys query i may see, as a half-open range [begin, end).
// (This baseline's own mask code, deliberately not shared with cpu_f64.)
void allowed_keys(const Problem& p, std::int64_t i, std::int64_t lq, std::int64_t lk, std::int64_t& begin,
                  std::int64_t& end) {
  begin = 0;
  end = lk;
  const std::int64_t shift = lk - lq;
  if (p.mask == MaskKind::causal_tl) end = std::min(lk, i + 1);
  if (p.mask == MaskKind::causal_br) end = std::min(lk, i + shift + 1);
  if (p.mask == MaskKind::window) {
    if (p.window_left >= 0) begin = std::max<std::int64_t>(0, i + shift - p.window_left);
    if (p.window_right >= 0) end = std::min(lk, i + shift + p.window_right + 1);
  }
  end = std::max(end, begin);
}

// out[n] += x * row[n] for n in [0, count): one step of many sequential sums at
// once. Vectorized across n only, so every out[n] is accumulated in exactly the
// textbook order, one rounding per product and per addition (no FMA: ISO C++
// mode compiles with -ffp-contract=off, and the clones keep that).
__attribute__((target_clones("avx512f", "avx2", "default"))) void accumulate(float* out, const float* row, float x,
                                                                           std::int64_t count) {
#pragma omp simd
  for (std::int64_t n = 0; n < count; ++n) out[n] += x * row[n];
}

// The score modifications (Problem::softcap, Problem::alibi) as a framework
// applies them to its working-precision scores: f32 arithmetic, each step
// rounded to the working dtype; the ALiBi slope in f32 (this baseline's own
// slope code).
struct Modification {
  DType working;
  float softcap = 0, slope = 0;
  std::int64_t shift = 0;  // lk - lq

  Modification(const Problem& p, DType working_dtype, std::int64_t h, std::int64_t lq, std::int64_t lk)
      : working(working_dtype), softcap(static_cast<float>(p.softcap)), shift(lk - lq) {
    if (!p.alibi) return;
    std::int64_t m = 1;  // the largest power of two <= heads_q
    while (m <= p.heads_q / 2) m *= 2;
    const double exponent = h < m ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(m)
                                  : -4.0 * static_cast<double>(2 * (h - m) + 1) / static_cast<double>(m);
    slope = static_cast<float>(std::exp2(exponent));
  }
  bool active() const { return softcap > 0 || slope != 0; }
  // The modified score of (i, j) from the scaled one; `t` receives
  // tanh(s / C) (rounded) where there is a softcap.
  float operator()(float s, std::int64_t i, std::int64_t j, float* t = nullptr) const {
    if (softcap > 0) {
      const float tanh_value = round_float(working, std::tanh(round_float(working, s / softcap)));
      if (t) *t = tanh_value;
      s = round_float(working, softcap * tanh_value);
    }
    if (slope != 0) {
      const auto distance = static_cast<float>(std::abs(i + shift - j));
      s = round_float(working, s - round_float(working, slope * distance));
    }
    return s;
  }
  // d(C tanh(s / C))/ds = 1 - tanh^2, rounded.
  float chain(float t) const { return round_float(working, 1.0f - round_float(working, t * t)); }
};

constexpr std::int64_t kRowsPerTask = 16;
// Query rows per block of the backward (the scores of a block stay in memory).
constexpr std::int64_t kBlockRows = 256;

}  // namespace

AttentionRows cpu_lowp_rows(const Problem& p, const Inputs& in, const RowSet& rows, DType working) {
  if (const std::string mismatch = page_table_mismatch(p, in.pages); !mismatch.empty())
    throw std::invalid_argument("cpu_lowp_rows: " + mismatch);
  // Key j of sequence b in its K/V tensor: (batch entry, position), or (pool page, slot) when paged.
  const auto key = [&](std::int64_t b, std::int64_t j) {
    return p.page_size > 0 ? std::pair{std::int64_t{in.pages.page(b, j / p.page_size)}, j % p.page_size}
                           : std::pair{b, j};
  };
  if (is_fp8(working) && !is_fp8(p.dtype))
    throw std::invalid_argument("cpu_lowp_rows: an fp8 working dtype takes fp8 inputs");
  AttentionRows out(p, rows);
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  const auto scale = static_cast<float>(p.softmax_scale);
  // fp8 attention as FlashAttention-3's and cuDNN's fp8 forwards compute it:
  // the inputs are the fp8 values times their descales (exact in f32), S = Q K^T
  // accumulated and kept in f32 (the tensor cores' output), the softmax in f32,
  // P = exp(S - max) unnormalized (in [0, 1]) rounded to the fp8 format for the
  // P V product (which takes two fp8 operands), the row sum l over the
  // unrounded f32 P, O = (P V) / l in f32, rounded to output_dtype (bf16).
  const bool fp8 = is_fp8(working);
  const DType score = fp8 ? DType::f32 : working;  // where the scores and inputs are rounded
  const DType o_dtype = output_dtype(working);
  std::vector<float> keys_transposed, values;  // K^T [d][lk] and V [lk][dv], rounded to `working`
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    std::vector<std::int64_t> slots;
    for (std::int64_t r = 0; r < rows.size(); ++r)
      if (rows.rows[r] < lq) slots.push_back(r);
    if (slots.empty() || lk == 0) continue;
    const auto tasks_per_head = (static_cast<std::int64_t>(slots.size()) + kRowsPerTask - 1) / kRowsPerTask;
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      keys_transposed.resize(static_cast<std::size_t>(d * lk));
      values.resize(static_cast<std::size_t>(lk * dv));
#pragma omp parallel for schedule(static) if (lk * (d + dv) > kParallelElements)
      for (std::int64_t j = 0; j < lk; ++j) {
        const auto [entry, position] = key(b, j);
        for (std::int64_t c = 0; c < d; ++c)
          keys_transposed[c * lk + j] = round_float(score, static_cast<float>(in.k.get(entry, hk, position, c)));
        for (std::int64_t c = 0; c < dv; ++c)
          values[j * dv + c] = round_float(score, static_cast<float>(in.v.get(entry, hk, position, c)));
      }
      const std::int64_t tasks = p.group_size() * tasks_per_head;
      const auto work = static_cast<std::int64_t>(slots.size()) * p.group_size() * lk * (d + dv);
#pragma omp parallel if (tasks > 1 && work > kParallelWork)
      {
        std::vector<float> query(static_cast<std::size_t>(d)), scores(static_cast<std::size_t>(lk)),
            accumulator(static_cast<std::size_t>(dv));
#pragma omp for schedule(dynamic)
        for (std::int64_t task = 0; task < tasks; ++task) {
          const std::int64_t h = hk * p.group_size() + task / tasks_per_head;
          const std::int64_t first = (task % tasks_per_head) * kRowsPerTask;
          const std::int64_t last = std::min<std::int64_t>(first + kRowsPerTask, static_cast<std::int64_t>(slots.size()));
          for (std::int64_t slot = first; slot < last; ++slot) {
            const std::int64_t r = slots[slot], i = rows.rows[r];
            std::int64_t begin, end;
            allowed_keys(p, i, lq, lk, begin, end);
            if (begin == end) continue;  // fully masked: O = 0, LSE = -inf as initialised
            in.q.read_row(b, h, i, query.data());
            // S = round(scale * Q K^T), each dot product summed over c in order, in f32.
            const std::int64_t width = end - begin;
            std::fill_n(scores.begin(), width, 0.0f);
            for (std::int64_t c = 0; c < d; ++c)
              accumulate(scores.data(), keys_transposed.data() + c * lk + begin, round_float(score, query[c]), width);
            float maximum = -std::numeric_limits<float>::infinity();
            bool saw_nan = false;
            const Modification modify(p, score, h, lq, lk);
            for (std::int64_t n = 0; n < width; ++n) {
              scores[n] = round_float(score, scores[n] * scale);
              if (modify.active()) scores[n] = modify(scores[n], i, begin + n);
              saw_nan = saw_nan || std::isnan(scores[n]);
              maximum = std::max(maximum, scores[n]);
            }
            if (saw_nan) maximum = std::numeric_limits<float>::quiet_NaN();
            // Softmax in f32; P rounded to the working dtype.
            float sum = 0;
            for (std::int64_t n = 0; n < width; ++n) {
              scores[n] = std::exp(scores[n] - maximum);
              sum += scores[n];
            }
            // fp8: P unnormalized in the format, the division after P V.
            for (std::int64_t n = 0; n < width; ++n) scores[n] = round_float(working, fp8 ? scores[n] : scores[n] / sum);
            out.lse[out.index(b, h, r)] = static_cast<double>(maximum + std::log(sum));
            // O = round(P V), summed over the visible keys in order, in f32. Masked
            // keys are absent (never multiplied by zero: 0 * Inf would be NaN).
            std::fill(accumulator.begin(), accumulator.end(), 0.0f);
            for (std::int64_t n = 0; n < width; ++n)
              accumulate(accumulator.data(), values.data() + (begin + n) * dv, scores[n], dv);
            double* o = out.o_row(b, h, r);
            for (std::int64_t c = 0; c < dv; ++c) o[c] = round_float(o_dtype, fp8 ? accumulator[c] / sum : accumulator[c]);
          }
        }
      }
    }
  }
  return out;
}

void round_o_to_fp8(AttentionRows& rows, DType fp8, double descale) {
  if (!is_fp8(fp8) || !(descale > 0)) throw std::invalid_argument("round_o_to_fp8: an fp8 dtype and a descale > 0");
  for (double& x : rows.o) x = round_to(fp8, x / descale) * descale;
}

GradientRows cpu_lowp_gradients(const Problem& p, const Inputs& in, const HostTensor& dout, const RowSet& q_rows,
                                const RowSet& kv_rows, DType working) {
  GradientRows out(p, q_rows, kv_rows);
  const std::int64_t d = p.head_dim, dv = p.head_dim_v, group = p.group_size();
  const auto scale = static_cast<float>(p.softmax_scale);
  const auto round_row = [working](std::vector<float>& row) {
    for (float& x : row) x = round_float(working, x);
  };
  std::vector<float> keys, keys_transposed, values;  // K [lk][d], K^T [d][lk], V [lk][dv], rounded to `working`
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    if (lq == 0 || lk == 0) continue;
    std::vector<std::int64_t> q_slot(static_cast<std::size_t>(lq), -1), kv_slots, kv_keys;
    for (std::int64_t r = 0; r < q_rows.size(); ++r)
      if (q_rows.rows[r] < lq) q_slot[q_rows.rows[r]] = r;
    for (std::int64_t r = 0; r < kv_rows.size(); ++r)
      if (kv_rows.rows[r] < lk) kv_slots.push_back(r), kv_keys.push_back(kv_rows.rows[r]);
    const auto selected = static_cast<std::int64_t>(kv_keys.size());
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      keys.resize(static_cast<std::size_t>(lk * d));
      keys_transposed.resize(static_cast<std::size_t>(d * lk));
      values.resize(static_cast<std::size_t>(lk * dv));
      for (std::int64_t j = 0; j < lk; ++j) {
        for (std::int64_t c = 0; c < d; ++c)
          keys_transposed[c * lk + j] = keys[j * d + c] = round_float(working, static_cast<float>(in.k.get(b, hk, j, c)));
        for (std::int64_t c = 0; c < dv; ++c)
          values[j * dv + c] = round_float(working, static_cast<float>(in.v.get(b, hk, j, c)));
      }
      // dK and dV of the group, in f32: each head's rounded sums added in head order.
      std::vector<float> group_dk(static_cast<std::size_t>(selected * d), 0.0f);
      std::vector<float> group_dv(static_cast<std::size_t>(selected * dv), 0.0f);
      for (std::int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        std::vector<float> head_dk(static_cast<std::size_t>(selected * d), 0.0f);
        std::vector<float> head_dv(static_cast<std::size_t>(selected * dv), 0.0f);
        // Query rows in blocks: the rows of a block in parallel (P, dS', dQ),
        // then the selected keys in parallel, each summing the block's rows in
        // order, so that every dK and dV sum runs over the rows in index order.
        for (std::int64_t first = 0; first < lq; first += kBlockRows) {
          const std::int64_t count = std::min(kBlockRows, lq - first);
          std::vector<float> probs(static_cast<std::size_t>(count * lk), 0.0f), dscores(probs.size(), 0.0f);
          std::vector<float> chains(p.softcap > 0 ? probs.size() : 0, 0.0f);
          std::vector<float> queries(static_cast<std::size_t>(count * d)), grads(static_cast<std::size_t>(count * dv));
          std::vector<std::int64_t> begins(static_cast<std::size_t>(count)), ends(static_cast<std::size_t>(count));
#pragma omp parallel if (count * lk * (d + dv) > kParallelWork)
          {
            std::vector<float> query(static_cast<std::size_t>(d)), grad(static_cast<std::size_t>(dv)),
                dq(static_cast<std::size_t>(d));
#pragma omp for schedule(dynamic)
            for (std::int64_t r = 0; r < count; ++r) {
              const std::int64_t i = first + r;
              std::int64_t begin, end;
              allowed_keys(p, i, lq, lk, begin, end);
              begins[r] = begin, ends[r] = end;
              in.q.read_row(b, h, i, query.data());
              dout.read_row(b, h, i, grad.data());
              round_row(query), round_row(grad);
              std::copy(query.begin(), query.end(), queries.begin() + r * d);
              std::copy(grad.begin(), grad.end(), grads.begin() + r * dv);
              if (begin == end) continue;  // fully masked: zero gradients
              const std::int64_t width = end - begin;
              float* pr = probs.data() + r * lk + begin;
              float* ds = dscores.data() + r * lk + begin;
              // P as the forward baseline computes it.
              for (std::int64_t c = 0; c < d; ++c)
                accumulate(pr, keys_transposed.data() + c * lk + begin, query[c], width);
              float maximum = -std::numeric_limits<float>::infinity();
              bool saw_nan = false;
              const Modification modify(p, working, h, lq, lk);
              // With a softcap: d(modified)/d(scaled) per key.
              float* chain = modify.softcap > 0 ? chains.data() + r * lk + begin : nullptr;
              for (std::int64_t n = 0; n < width; ++n) {
                pr[n] = round_float(working, pr[n] * scale);
                if (modify.active()) {
                  float t = 0;
                  pr[n] = modify(pr[n], i, begin + n, &t);
                  if (modify.softcap > 0) chain[n] = modify.chain(t);
                }
                saw_nan = saw_nan || std::isnan(pr[n]);
                maximum = std::max(maximum, pr[n]);
              }
              if (saw_nan) maximum = std::numeric_limits<float>::quiet_NaN();
              float sum = 0;
              for (std::int64_t n = 0; n < width; ++n) {
                pr[n] = std::exp(pr[n] - maximum);
                sum += pr[n];
              }
              for (std::int64_t n = 0; n < width; ++n) pr[n] = round_float(working, pr[n] / sum);
              // dP = round(dO V^T), each dot product in order; D = sum_j P dP in f32; dS' = round(scale round(P (dP - D))).
              float delta = 0;
              for (std::int64_t n = 0; n < width; ++n) {
                float dot = 0;
                const float* v = values.data() + (begin + n) * dv;
                for (std::int64_t c = 0; c < dv; ++c) dot += grad[c] * v[c];
                ds[n] = round_float(working, dot);
                delta += pr[n] * ds[n];
              }
              for (std::int64_t n = 0; n < width; ++n) {
                float product = round_float(working, pr[n] * (ds[n] - delta));
                if (modify.softcap > 0) product = round_float(working, product * chain[n]);
                ds[n] = round_float(working, scale * product);
              }
              if (const std::int64_t slot = q_slot[i]; slot >= 0) {
                std::fill(dq.begin(), dq.end(), 0.0f);
                for (std::int64_t n = 0; n < width; ++n) accumulate(dq.data(), keys.data() + (begin + n) * d, ds[n], d);
                double* target = out.dq_row(b, h, slot);
                for (std::int64_t c = 0; c < d; ++c) target[c] = round_float(working, dq[c]);
              }
            }
#pragma omp for schedule(static)
            for (std::int64_t s = 0; s < selected; ++s) {
              const std::int64_t j = kv_keys[s];
              for (std::int64_t r = 0; r < count; ++r) {
                if (j < begins[r] || j >= ends[r]) continue;  // masked: absent
                accumulate(head_dv.data() + s * dv, grads.data() + r * dv, probs[r * lk + j], dv);
                accumulate(head_dk.data() + s * d, queries.data() + r * d, dscores[r * lk + j], d);
              }
            }
          }
        }
        for (std::size_t n = 0; n < group_dk.size(); ++n) group_dk[n] += round_float(working, head_dk[n]);
        for (std::size_t n = 0; n < group_dv.size(); ++n) group_dv[n] += round_float(working, head_dv[n]);
      }
      for (std::int64_t s = 0; s < selected; ++s) {
        double* dk = out.dk_row(b, hk, kv_slots[s]);
        double* dvr = out.dv_row(b, hk, kv_slots[s]);
        for (std::int64_t c = 0; c < d; ++c) dk[c] = round_float(working, group_dk[s * d + c]);
        for (std::int64_t c = 0; c < dv; ++c) dvr[c] = round_float(working, group_dv[s * dv + c]);
      }
    }
  }
  return out;
}

RunResult CpuLowp::run(const Problem& problem, const Inputs& inputs) {
  if (auto refusal_outside = refuse_outside(capabilities(), problem)) return *refusal_outside;
  RunResult result;
  const auto start = std::chrono::steady_clock::now();
  const AttentionRows rows = cpu_lowp_rows(problem, inputs, all_rows(problem), problem.dtype);
  result.outputs = make_outputs(problem);
  result.outputs.has_lse = true;
  for (std::int64_t b = 0; b < problem.batch; ++b)
    for (std::int64_t h = 0; h < problem.heads_q; ++h)
      for (std::int64_t i = 0; i < problem.seqlen_q; ++i) {
        const double* o = rows.o_row(b, h, i);
        for (std::int64_t c = 0; c < problem.head_dim_v; ++c) result.outputs.o.set(b, h, i, c, o[c]);
        result.outputs.lse[(b * problem.heads_q + h) * problem.seqlen_q + i] =
            static_cast<float>(rows.lse[rows.index(b, h, i)]);
      }
  result.time_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace flashcheck
