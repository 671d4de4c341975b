#include "oracles/cpu_lowp.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <vector>

#include "oracles/blas.hpp"

namespace flashcheck {
namespace {

float round_float(DType working, float x) {
  return working == DType::f32 ? x : static_cast<float>(round_to(working, x));
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

constexpr std::int64_t kRowsPerBlock = 64;

}  // namespace

AttentionRows cpu_lowp_rows(const Problem& p, const Inputs& in, const RowSet& rows, DType working) {
  AttentionRows out(p, rows);
  use_single_threaded_blas();
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  const auto scale = static_cast<float>(p.softmax_scale);
  std::vector<float> keys, values;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    std::vector<std::int64_t> slots;
    for (std::int64_t r = 0; r < rows.size(); ++r)
      if (rows.rows[r] < lq) slots.push_back(r);
    if (slots.empty() || lk == 0) continue;
    const auto blocks = (static_cast<std::int64_t>(slots.size()) + kRowsPerBlock - 1) / kRowsPerBlock;
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      keys.resize(static_cast<std::size_t>(lk * d));
      values.resize(static_cast<std::size_t>(lk * dv));
      bool values_finite = true;
#pragma omp parallel for schedule(static) reduction(&& : values_finite) if (lk * (d + dv) > kParallelElements)
      for (std::int64_t j = 0; j < lk; ++j) {
        in.k.read_row(b, hk, j, keys.data() + j * d);
        in.v.read_row(b, hk, j, values.data() + j * dv);
        for (std::int64_t c = 0; c < d; ++c) keys[j * d + c] = round_float(working, keys[j * d + c]);
        for (std::int64_t c = 0; c < dv; ++c) {
          values[j * dv + c] = round_float(working, values[j * dv + c]);
          values_finite = values_finite && std::isfinite(values[j * dv + c]);
        }
      }
      const std::int64_t tasks = p.group_size() * blocks;
      const auto row_slots_count = static_cast<std::int64_t>(slots.size()) * p.group_size();
#pragma omp parallel if (tasks > 1 && static_cast<std::int64_t>(row_slots_count) * lk * (d + dv) > kParallelWork)
      {
        std::vector<float> queries(static_cast<std::size_t>(kRowsPerBlock * d));
        std::vector<float> scores(static_cast<std::size_t>(kRowsPerBlock * lk));
        std::vector<float> block_out(static_cast<std::size_t>(kRowsPerBlock * dv));
#pragma omp for schedule(dynamic)
        for (std::int64_t task = 0; task < tasks; ++task) {
          const std::int64_t h = hk * p.group_size() + task / blocks;
          const std::int64_t first = (task % blocks) * kRowsPerBlock;
          const std::int64_t count = std::min<std::int64_t>(kRowsPerBlock, static_cast<std::int64_t>(slots.size()) - first);
          for (std::int64_t r = 0; r < count; ++r) {
            float* q = queries.data() + r * d;
            in.q.read_row(b, h, rows.rows[slots[first + r]], q);
            for (std::int64_t c = 0; c < d; ++c) q[c] = round_float(working, q[c]);
          }
          // Q K^T accumulated in f32 (sgemm), then scaled and rounded to the working dtype.
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(count), static_cast<int>(lk),
                      static_cast<int>(d), 1.0f, queries.data(), static_cast<int>(d), keys.data(), static_cast<int>(d),
                      0.0f, scores.data(), static_cast<int>(lk));
          for (std::int64_t r = 0; r < count; ++r) {
            const std::int64_t i = rows.rows[slots[first + r]];
            std::int64_t begin, end;
            allowed_keys(p, i, lq, lk, begin, end);
            float* s = scores.data() + r * lk;
            if (begin == end) {  // fully masked row
              std::fill(s, s + lk, 0.0f);
              continue;
            }
            float maximum = -std::numeric_limits<float>::infinity();
            bool saw_nan = false;
            for (std::int64_t j = begin; j < end; ++j) {
              s[j] = round_float(working, s[j] * scale);
              saw_nan = saw_nan || std::isnan(s[j]);
              maximum = std::max(maximum, s[j]);
            }
            if (saw_nan) maximum = std::numeric_limits<float>::quiet_NaN();
            float sum = 0;
            for (std::int64_t j = begin; j < end; ++j) {
              s[j] = std::exp(s[j] - maximum);
              sum += s[j];
            }
            for (std::int64_t j = 0; j < lk; ++j) s[j] = (j >= begin && j < end) ? round_float(working, s[j] / sum) : 0.0f;
            out.lse[out.index(b, h, slots[first + r])] = static_cast<double>(maximum + std::log(sum));
          }
          // P V accumulated in f32; masked keys are skipped, never multiplied by zero.
          if (values_finite) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(count), static_cast<int>(dv),
                        static_cast<int>(lk), 1.0f, scores.data(), static_cast<int>(lk), values.data(),
                        static_cast<int>(dv), 0.0f, block_out.data(), static_cast<int>(dv));
          } else {
            std::fill(block_out.begin(), block_out.end(), 0.0f);
            for (std::int64_t r = 0; r < count; ++r) {
              std::int64_t begin, end;
              allowed_keys(p, rows.rows[slots[first + r]], lq, lk, begin, end);
              for (std::int64_t j = begin; j < end; ++j)
                for (std::int64_t c = 0; c < dv; ++c) block_out[r * dv + c] += scores[r * lk + j] * values[j * dv + c];
            }
          }
          for (std::int64_t r = 0; r < count; ++r) {
            std::int64_t begin, end;
            allowed_keys(p, rows.rows[slots[first + r]], lq, lk, begin, end);
            if (begin == end) continue;
            double* o = out.o_row(b, h, slots[first + r]);
            for (std::int64_t c = 0; c < dv; ++c) o[c] = round_float(working, block_out[r * dv + c]);
          }
        }
      }
    }
  }
  return out;
}

RunResult CpuLowp::run(const Problem& problem, const Inputs& inputs) {
  RunResult result;
  if (auto reason = unsupported_reason(capabilities(), problem)) {
    result.status = Status::unsupported;
    result.message = *reason;
    return result;
  }
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
