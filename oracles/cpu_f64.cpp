#include "flashcheck/oracles/cpu_f64.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcheck/oracles/blas.hpp"
#include "flashcheck/oracles/exp_f64.hpp"
#include "cpu_f64_rows.hpp"

namespace flashcheck {
namespace {

using namespace cpu_f64_detail;

}  // namespace

AttentionRows cpu_f64_reference(const Problem& p, const Inputs& in, const RowSet& rows, bool with_condition) {
  if (const std::string mismatch = page_table_mismatch(p, in.pages); !mismatch.empty())
    throw std::invalid_argument("cpu_f64_reference: " + mismatch);
  // Key j of sequence b: row j of its K/V, or slot j % P of its page's pool page.
  const auto read_key = [&](const HostTensor& t, std::int64_t b, std::int64_t hk, std::int64_t j, double* row) {
    if (p.page_size > 0) t.read_row(in.pages.entries[b * in.pages.per_sequence + j / p.page_size], hk, j % p.page_size, row);
    else t.read_row(b, hk, j, row);
  };
  AttentionRows out(p, rows);
  if (with_condition) {
    out.lse_condition.assign(out.lse.size(), 0.0);
    out.o_condition.assign(out.o.size(), 0.0);
  }
  use_single_threaded_blas();
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  std::vector<double> keys, values, abs_keys, abs_values;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    std::vector<std::int64_t> row_slots;  // indices into rows.rows of this sequence's valid rows
    for (std::int64_t r = 0; r < rows.size(); ++r)
      if (rows.rows[r] < lq) row_slots.push_back(r);
    if (row_slots.empty() || lk == 0) continue;  // nothing to compute: fully masked or padding
    const std::int64_t block = rows_per_block(lk);
    const std::int64_t blocks = (static_cast<std::int64_t>(row_slots.size()) + block - 1) / block;

    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      keys.resize(static_cast<std::size_t>(lk * d));
      values.resize(static_cast<std::size_t>(lk * dv));
      bool values_finite = true;
#pragma omp parallel for schedule(static) reduction(&& : values_finite) if (lk * (d + dv) > kParallelElements)
      for (std::int64_t j = 0; j < lk; ++j) {
        read_key(in.k, b, hk, j, keys.data() + j * d);
        read_key(in.v, b, hk, j, values.data() + j * dv);
        for (std::int64_t c = 0; c < dv; ++c) values_finite = values_finite && std::isfinite(values[j * dv + c]);
      }
      if (with_condition) {
        abs_keys.resize(keys.size());
        abs_values.resize(values.size());
        for (std::size_t n = 0; n < keys.size(); ++n) abs_keys[n] = std::fabs(keys[n]);
        // Non-finite values are the NaN/Inf census's business; the conditioning
        // counts them as 0 so that the finite elements' floors stay finite.
        for (std::size_t n = 0; n < values.size(); ++n)
          abs_values[n] = std::isfinite(values[n]) ? std::fabs(values[n]) : 0.0;
      }

      const std::int64_t tasks = p.group_size() * blocks;
      const auto row_slots_count = static_cast<std::int64_t>(row_slots.size()) * p.group_size();
#pragma omp parallel if (tasks > 1 && static_cast<std::int64_t>(row_slots_count) * lk * (d + dv) > kParallelWork)
      {
        std::vector<double> queries(static_cast<std::size_t>(block * d));
        std::vector<double> scores;
        std::vector<double> block_out(static_cast<std::size_t>(block * dv));
        std::vector<KeyRange> ranges(static_cast<std::size_t>(block));
        std::vector<double> row_sum(static_cast<std::size_t>(block));
        std::vector<double> abs_queries, weights, condition_out;  // with_condition only
#pragma omp for schedule(dynamic)
        for (std::int64_t task = 0; task < tasks; ++task) {
          const std::int64_t h = hk * p.group_size() + task / blocks;
          const std::int64_t begin = (task % blocks) * block;
          const std::int64_t count = std::min<std::int64_t>(block, static_cast<std::int64_t>(row_slots.size()) - begin);
          std::int64_t key_lo = lk, key_hi = -1;
          for (std::int64_t r = 0; r < count; ++r) {
            const std::int64_t i = rows.rows[row_slots[begin + r]];
            ranges[r] = visible_keys(p, i, lq, lk);
            if (!ranges[r].empty()) {
              key_lo = std::min(key_lo, ranges[r].first);
              key_hi = std::max(key_hi, ranges[r].last);
            }
            in.q.read_row(b, h, i, queries.data() + r * d);
          }
          if (key_hi < key_lo) continue;  // every row fully masked: O = 0, LSE = -inf already
          const std::int64_t width = key_hi - key_lo + 1;
          scores.resize(static_cast<std::size_t>(count * width));
          // S = scale * Q K^T over the keys any row of the block sees.
          cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(count), static_cast<int>(width),
                      static_cast<int>(d), p.softmax_scale, queries.data(), static_cast<int>(d),
                      keys.data() + key_lo * d, static_cast<int>(d), 0.0, scores.data(), static_cast<int>(width));
          // Pass 1: row maximum (NaN-propagating). Pass 2: exponentials and their sum.
          const ScoreModification modify(p, h, lq, lk);
          for (std::int64_t r = 0; r < count; ++r) {
            double* s = scores.data() + r * width;
            const KeyRange range = ranges[r];
            const std::int64_t first = range.first - key_lo, last = range.last - key_lo;
            if (range.empty()) {
              std::fill(s, s + width, 0.0);
              row_sum[r] = 0;
              continue;
            }
            if (modify.active()) {
              const std::int64_t i = rows.rows[row_slots[begin + r]];
              for (std::int64_t j = first; j <= last; ++j) s[j] = modify(s[j], i, key_lo + j);
            }
            double maximum = -std::numeric_limits<double>::infinity();
            for (std::int64_t j = first; j <= last; ++j) {
              if (std::isnan(s[j])) {
                maximum = s[j];
                break;
              }
              maximum = std::max(maximum, s[j]);
            }
            const double sum = exp_shifted_sum(s + first, last - first + 1, maximum);
            std::fill(s, s + first, 0.0);
            std::fill(s + last + 1, s + width, 0.0);
            row_sum[r] = sum;
            out.lse[out.index(b, h, row_slots[begin + r])] = maximum + std::log(sum);
          }
          // O = P V / l. Masked keys must be absent, not multiplied by zero: with
          // non-finite values, 0 * Inf would be NaN, so that case sums only the visible keys.
          if (values_finite) {
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(count), static_cast<int>(dv),
                        static_cast<int>(width), 1.0, scores.data(), static_cast<int>(width),
                        values.data() + key_lo * dv, static_cast<int>(dv), 0.0, block_out.data(), static_cast<int>(dv));
          } else {
            std::fill(block_out.begin(), block_out.end(), 0.0);
            for (std::int64_t r = 0; r < count; ++r) {
              if (ranges[r].empty()) continue;
              for (std::int64_t j = ranges[r].first; j <= ranges[r].last; ++j) {
                const double weight = scores[r * width + (j - key_lo)];
                for (std::int64_t c = 0; c < dv; ++c) block_out[r * dv + c] += weight * values[j * dv + c];
              }
            }
          }
          for (std::int64_t r = 0; r < count; ++r) {
            if (ranges[r].empty()) continue;
            double* o = out.o_row(b, h, row_slots[begin + r]);
            for (std::int64_t c = 0; c < dv; ++c) o[c] = block_out[r * dv + c] / row_sum[r];
          }
          if (with_condition) {
            // A = scale |Q| |K|^T (each logit's absolute condition), W = P o A
            // with P normalised; per row sum_j W_j, per element W |V| + |O| sum_j W_j.
            abs_queries.resize(static_cast<std::size_t>(count * d));
            for (std::int64_t n = 0; n < count * d; ++n) abs_queries[n] = std::fabs(queries[n]);
            weights.resize(static_cast<std::size_t>(count * width));
            condition_out.resize(static_cast<std::size_t>(count * dv));
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(count), static_cast<int>(width),
                        static_cast<int>(d), p.softmax_scale, abs_queries.data(), static_cast<int>(d),
                        abs_keys.data() + key_lo * d, static_cast<int>(d), 0.0, weights.data(), static_cast<int>(width));
            // ALiBi's bias is one more term of each logit, rounded once in f32.
            // A key of weight 0 (masked, or its exponential underflowed) adds
            // exactly 0, not 0 times its condition: a NaN or Inf in that key's K
            // made it NaN, and the row's sum with it. Until 2026-11-27 it did,
            // and the floor lost its logit terms on every row of a block that
            // shared keys with a non-finite one (gpu tier, H100: wmma-tiles on
            // f32 `values=nan_inf(0.02)` causal_tl, LSE 8.4e-5 off, exactly the
            // f16 rounding of its inputs it declares, against a floor of 6.8e-7;
            // docs/perf.md).
            for (std::int64_t r = 0; r < count; ++r) {
              const std::int64_t i = rows.rows[row_slots[begin + r]];
              for (std::int64_t j = 0; j < width; ++j) {
                const double weight = row_sum[r] > 0 ? scores[r * width + j] / row_sum[r] : 0.0;
                double& w = weights[r * width + j];
                w = weight == 0 ? 0.0 : (w + modify.bias_magnitude(i, key_lo + j)) * weight;
              }
            }
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(count), static_cast<int>(dv),
                        static_cast<int>(width), 1.0, weights.data(), static_cast<int>(width),
                        abs_values.data() + key_lo * dv, static_cast<int>(dv), 0.0, condition_out.data(),
                        static_cast<int>(dv));
            for (std::int64_t r = 0; r < count; ++r) {
              if (ranges[r].empty()) continue;
              double logit_condition = 0;
              for (std::int64_t j = 0; j < width; ++j) logit_condition += weights[r * width + j];
              const std::int64_t slot = row_slots[begin + r];
              out.lse_condition[out.index(b, h, slot)] = logit_condition;
              const double* o = out.o_row(b, h, slot);
              double* condition = out.o_condition.data() + out.index(b, h, slot) * dv;
              for (std::int64_t c = 0; c < dv; ++c)
                condition[c] = condition_out[r * dv + c] + std::fabs(o[c]) * logit_condition;
            }
          }
        }
      }
    }
  }
  return out;
}


}  // namespace flashcheck
