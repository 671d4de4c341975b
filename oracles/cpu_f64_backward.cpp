#include "flashcheck/oracles/cpu_f64_backward.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "flashcheck/oracles/blas.hpp"
#include "flashcheck/oracles/exp_f64.hpp"
#include "cpu_f64_rows.hpp"

namespace flashcheck {
namespace {

using namespace cpu_f64_detail;


bool all_finite(const std::vector<double>& x, std::int64_t first, std::int64_t count) {
  for (std::int64_t n = first; n < first + count; ++n)
    if (!std::isfinite(x[n])) return false;
  return true;
}

// C (m x n, ldc) = alpha A B^T or alpha A B with row-major operands.
void gemm(bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* a,
          std::int64_t lda, const double* b, std::int64_t ldb, double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0,
              c, static_cast<int>(ldc));
}

// C (m x n) = alpha A^T B, A (k x m), B (k x n), row-major.
void gemm_at(std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const double* a, std::int64_t lda,
             const double* b, std::int64_t ldb, double* c, std::int64_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), 0.0, c, static_cast<int>(ldc));
}

}  // namespace

GradientRows cpu_f64_gradients(const Problem& p, const Inputs& in, const HostTensor& dout, const RowSet& q_rows,
                               const RowSet& kv_rows) {
  GradientRows out(p, q_rows, kv_rows);
  use_single_threaded_blas();
  const std::int64_t d = p.head_dim, dv = p.head_dim_v, group = p.group_size();
  std::vector<double> keys, values;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    if (lq == 0 || lk == 0) continue;  // no query sees a key: every gradient is 0
    // Where each valid query row's dQ goes (-1: not asked for), and the key
    // rows asked for within the valid length.
    std::vector<std::int64_t> q_slot(static_cast<std::size_t>(lq), -1);
    for (std::int64_t r = 0; r < q_rows.size(); ++r)
      if (q_rows.rows[r] < lq) q_slot[q_rows.rows[r]] = r;
    std::vector<std::int64_t> kv_slots, kv_keys;  // slot in kv_rows, key index
    for (std::int64_t r = 0; r < kv_rows.size(); ++r)
      if (kv_rows.rows[r] < lk) {
        kv_slots.push_back(r);
        kv_keys.push_back(kv_rows.rows[r]);
      }
    const auto selected = static_cast<std::int64_t>(kv_keys.size());
    const std::int64_t block = rows_per_block(lk);
    const std::int64_t blocks = (lq + block - 1) / block;
    const std::int64_t tasks = group * blocks;

    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      keys.resize(static_cast<std::size_t>(lk * d));
      values.resize(static_cast<std::size_t>(lk * dv));
      for (std::int64_t j = 0; j < lk; ++j) {
        in.k.read_row(b, hk, j, keys.data() + j * d);
        in.v.read_row(b, hk, j, values.data() + j * dv);
      }
      const bool keys_finite = all_finite(keys, 0, lk * d), values_finite = all_finite(values, 0, lk * dv);
      // Each task's partial dK and dV of the selected keys, summed in task order below.
      std::vector<double> partial_dk(static_cast<std::size_t>(tasks * selected * d), 0.0);
      std::vector<double> partial_dv(static_cast<std::size_t>(tasks * selected * dv), 0.0);
      // The conditioning (GradientRows::dq_terms_max ...): per task, the
      // largest dQ terms of its rows; per (task, selected key), the sums over
      // the task's rows of P, and of dK's and dV's terms.
      std::vector<double> task_dq(static_cast<std::size_t>(tasks * 2), 0.0);          // W, X
      std::vector<double> partial_key(static_cast<std::size_t>(tasks * selected * 5), 0.0);  // P, W_dk, X_dk, W_dv, X_dv
      // Per key: max_c |K_jc| and |k_j| (scale sqrt(d) |q_i| |k_j| bounds sqrt(d) times logit (i, j)'s condition).
      std::vector<double> k_max(static_cast<std::size_t>(lk), 0.0), k_norm(static_cast<std::size_t>(lk), 0.0);
      for (std::int64_t j = 0; j < lk; ++j) {
        double sq = 0;
        for (std::int64_t c = 0; c < d; ++c) {
          if (std::isfinite(keys[j * d + c])) k_max[j] = std::max(k_max[j], std::abs(keys[j * d + c]));
          sq += keys[j * d + c] * keys[j * d + c];
        }
        k_norm[j] = std::isfinite(sq) ? std::sqrt(sq) : 0.0;
      }

#pragma omp parallel if (tasks > 1 && lq * lk * (2 * d + 2 * dv) > kParallelWork)
      {
        std::vector<double> queries(static_cast<std::size_t>(block * d)), grads(static_cast<std::size_t>(block * dv));
        std::vector<double> probs, dprobs, dq_block(static_cast<std::size_t>(block * d));
        std::vector<double> sel_probs, sel_ds, chain;
        std::vector<KeyRange> ranges(static_cast<std::size_t>(block));
        std::vector<double> row_lse(static_cast<std::size_t>(block), 0.0);
#pragma omp for schedule(dynamic)
        for (std::int64_t task = 0; task < tasks; ++task) {
          const std::int64_t h = hk * group + task / blocks;
          const std::int64_t begin = (task % blocks) * block, count = std::min(block, lq - begin);
          std::int64_t key_lo = lk, key_hi = -1;
          for (std::int64_t r = 0; r < count; ++r) {
            ranges[r] = visible_keys(p, begin + r, lq, lk);
            if (!ranges[r].empty()) {
              key_lo = std::min(key_lo, ranges[r].first);
              key_hi = std::max(key_hi, ranges[r].last);
            }
            in.q.read_row(b, h, begin + r, queries.data() + r * d);
            dout.read_row(b, h, begin + r, grads.data() + r * dv);
          }
          if (key_hi < key_lo) continue;  // every row fully masked: zero gradients
          const std::int64_t width = key_hi - key_lo + 1;
          const bool rows_finite = all_finite(queries, 0, count * d) && all_finite(grads, 0, count * dv);
          probs.resize(static_cast<std::size_t>(count * width));
          dprobs.resize(static_cast<std::size_t>(count * width));
          // S = scale Q K^T, then P = softmax(S) over each row's visible keys (0 elsewhere).
          gemm(true, count, width, d, p.softmax_scale, queries.data(), d, keys.data() + key_lo * d, d, probs.data(),
               width);
          // With a softcap or ALiBi: the modified logits, and with a softcap
          // the chain rule's factor d(modified)/d(scaled logit) per pair.
          const ScoreModification modify(p, h, lq, lk);
          if (modify.softcap > 0) chain.assign(static_cast<std::size_t>(count * width), 0.0);
          for (std::int64_t r = 0; r < count; ++r) {
            double* s = probs.data() + r * width;
            if (ranges[r].empty()) {
              std::fill(s, s + width, 0.0);
              continue;
            }
            const std::int64_t first = ranges[r].first - key_lo, last = ranges[r].last - key_lo;
            if (modify.active())
              for (std::int64_t j = first; j <= last; ++j) {
                if (modify.softcap > 0) chain[r * width + j] = modify.derivative(s[j]);
                s[j] = modify(s[j], begin + r, key_lo + j);
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
            row_lse[r] = maximum + std::log(sum);
            for (std::int64_t j = first; j <= last; ++j) s[j] /= sum;
            std::fill(s, s + first, 0.0);
            std::fill(s + last + 1, s + width, 0.0);
          }
          // dP = dO V^T on the visible keys.
          if (values_finite && rows_finite) {
            gemm(true, count, width, dv, 1.0, grads.data(), dv, values.data() + key_lo * dv, dv, dprobs.data(), width);
          } else {
            std::fill(dprobs.begin(), dprobs.end(), 0.0);
            for (std::int64_t r = 0; r < count; ++r)
              for (std::int64_t j = ranges[r].first; j <= ranges[r].last; ++j) {
                double dot = 0;
                for (std::int64_t c = 0; c < dv; ++c) dot += grads[r * dv + c] * values[j * dv + c];
                dprobs[r * width + (j - key_lo)] = dot;
              }
          }
          // D_i = sum_j P_ij dP_ij, then dS = P o (dP - D), stored over dP; 0 off the visible keys.
          for (std::int64_t r = 0; r < count; ++r) {
            double* ds = dprobs.data() + r * width;
            const double* pr = probs.data() + r * width;
            if (ranges[r].empty()) {
              std::fill(ds, ds + width, 0.0);
              continue;
            }
            const std::int64_t first = ranges[r].first - key_lo, last = ranges[r].last - key_lo;
            double delta = 0;
            for (std::int64_t j = first; j <= last; ++j) delta += pr[j] * ds[j];
            // The conditioning terms of this row (tolerance.hpp's gradient floor):
            // g_j = P_ij (|dP_ij| + |D_i|), e_j = a_ij + A_i + |LSE_i| (P_ij's
            // relative perturbation by its logits and LSE, in f32 roundings).
            double q_norm = 0, q_max = 0, do_max = 0;
            for (std::int64_t c = 0; c < d; ++c) {
              q_norm += queries[r * d + c] * queries[r * d + c];
              if (std::isfinite(queries[r * d + c])) q_max = std::max(q_max, std::abs(queries[r * d + c]));
            }
            for (std::int64_t c = 0; c < dv; ++c)
              if (std::isfinite(grads[r * dv + c])) do_max = std::max(do_max, std::abs(grads[r * dv + c]));
            const double c_row = std::sqrt(static_cast<double>(d)) * p.softmax_scale * std::sqrt(q_norm);
            // ALiBi's bias: one more term of each logit (rounded once in f32).
            const auto a = [&](std::int64_t j) {
              return c_row * k_norm[key_lo + j] + modify.bias_magnitude(begin + r, key_lo + j);
            };
            double a_mean = 0;
            for (std::int64_t j = first; j <= last; ++j) a_mean += pr[j] * a(j);
            const double lse_abs = std::isfinite(row_lse[r]) ? std::abs(row_lse[r]) : 0.0;
            const auto finite_or_0 = [](double x) { return std::isfinite(x) ? x : 0.0; };
            double w_dq = 0, x_dq = 0;
            for (std::int64_t j = first; j <= last; ++j) {
              const double g = finite_or_0(pr[j] * (std::abs(ds[j]) + std::abs(delta)));
              const double e = finite_or_0(a(j) + a_mean + lse_abs);
              w_dq += g * k_max[key_lo + j];
              x_dq += g * e * k_max[key_lo + j];
            }
            if (q_slot[begin + r] >= 0) {
              task_dq[task * 2] = std::max(task_dq[task * 2], finite_or_0(p.softmax_scale * w_dq));
              task_dq[task * 2 + 1] = std::max(task_dq[task * 2 + 1], finite_or_0(p.softmax_scale * x_dq));
            }
            for (std::int64_t s = 0; s < selected; ++s) {
              const std::int64_t j = kv_keys[s] - key_lo;
              if (j < first || j > last) continue;
              const double g = finite_or_0(pr[j] * (std::abs(ds[j]) + std::abs(delta)));
              const double e = finite_or_0(a(j) + a_mean + lse_abs);
              double* key = partial_key.data() + (task * selected + s) * 5;
              key[0] += finite_or_0(pr[j]);
              key[1] += g * q_max;
              key[2] += g * e * q_max;
              key[3] += finite_or_0(pr[j]) * do_max;
              key[4] += finite_or_0(pr[j]) * e * do_max;
            }
            for (std::int64_t j = first; j <= last; ++j) ds[j] = pr[j] * (ds[j] - delta);
            if (modify.softcap > 0)
              for (std::int64_t j = first; j <= last; ++j) ds[j] *= chain[r * width + j];
            std::fill(ds, ds + first, 0.0);
            std::fill(ds + last + 1, ds + width, 0.0);
          }
          // dQ = scale dS K, for the rows asked for.
          bool any_dq = false;
          for (std::int64_t r = 0; r < count && !any_dq; ++r) any_dq = q_slot[begin + r] >= 0;
          if (any_dq) {
            if (keys_finite) {
              gemm(false, count, d, width, p.softmax_scale, dprobs.data(), width, keys.data() + key_lo * d, d,
                   dq_block.data(), d);
            } else {
              std::fill(dq_block.begin(), dq_block.end(), 0.0);
              for (std::int64_t r = 0; r < count; ++r)
                for (std::int64_t j = ranges[r].first; j <= ranges[r].last; ++j)
                  for (std::int64_t c = 0; c < d; ++c)
                    dq_block[r * d + c] += p.softmax_scale * dprobs[r * width + (j - key_lo)] * keys[j * d + c];
            }
            for (std::int64_t r = 0; r < count; ++r)
              if (const std::int64_t slot = q_slot[begin + r]; slot >= 0 && !ranges[r].empty())
                std::copy_n(dq_block.data() + r * d, d, out.dq_row(b, h, slot));
          }
          // This block's share of dK = scale dS^T Q and dV = P^T dO for the selected keys it sees.
          double* task_dk = partial_dk.data() + task * selected * d;
          double* task_dv = partial_dv.data() + task * selected * dv;
          if (selected == 0) continue;
          if (rows_finite) {
            sel_probs.assign(static_cast<std::size_t>(count * selected), 0.0);
            sel_ds.assign(static_cast<std::size_t>(count * selected), 0.0);
            for (std::int64_t s = 0; s < selected; ++s) {
              const std::int64_t j = kv_keys[s];
              if (j < key_lo || j > key_hi) continue;
              for (std::int64_t r = 0; r < count; ++r) {
                sel_probs[r * selected + s] = probs[r * width + (j - key_lo)];
                sel_ds[r * selected + s] = dprobs[r * width + (j - key_lo)];
              }
            }
            gemm_at(selected, dv, count, 1.0, sel_probs.data(), selected, grads.data(), dv, task_dv, dv);
            gemm_at(selected, d, count, p.softmax_scale, sel_ds.data(), selected, queries.data(), d, task_dk, d);
          } else {
            for (std::int64_t s = 0; s < selected; ++s) {
              const std::int64_t j = kv_keys[s];
              for (std::int64_t r = 0; r < count; ++r) {
                if (ranges[r].empty() || j < ranges[r].first || j > ranges[r].last) continue;
                const double pr = probs[r * width + (j - key_lo)], ds = dprobs[r * width + (j - key_lo)];
                for (std::int64_t c = 0; c < dv; ++c) task_dv[s * dv + c] += pr * grads[r * dv + c];
                for (std::int64_t c = 0; c < d; ++c) task_dk[s * d + c] += p.softmax_scale * ds * queries[r * d + c];
              }
            }
          }
        }
      }
      // The conditioning of this (batch, K/V head).
      for (std::int64_t task = 0; task < tasks; ++task) {
        out.dq_terms_max = std::max(out.dq_terms_max, task_dq[task * 2]);
        out.dq_logit_terms_max = std::max(out.dq_logit_terms_max, task_dq[task * 2 + 1]);
      }
      for (std::int64_t s = 0; s < selected; ++s) {
        double sums[5] = {0, 0, 0, 0, 0};
        for (std::int64_t task = 0; task < tasks; ++task)
          for (int k = 0; k < 5; ++k) sums[k] += partial_key[(task * selected + s) * 5 + k];
        out.key_weight_max = std::max(out.key_weight_max, sums[0]);
        out.dk_terms_max = std::max(out.dk_terms_max, p.softmax_scale * sums[1]);
        out.dk_logit_terms_max = std::max(out.dk_logit_terms_max, p.softmax_scale * sums[2]);
        out.dv_terms_max = std::max(out.dv_terms_max, sums[3]);
        out.dv_logit_terms_max = std::max(out.dv_logit_terms_max, sums[4]);
      }
      // Sum the tasks' shares in task order (query head, then block): the same
      // result whatever the thread count.
      for (std::int64_t task = 0; task < tasks; ++task)
        for (std::int64_t s = 0; s < selected; ++s) {
          double* dk = out.dk_row(b, hk, kv_slots[s]);
          double* dvr = out.dv_row(b, hk, kv_slots[s]);
          const double* task_dk = partial_dk.data() + (task * selected + s) * d;
          const double* task_dv = partial_dv.data() + (task * selected + s) * dv;
          for (std::int64_t c = 0; c < d; ++c) dk[c] += task_dk[c];
          for (std::int64_t c = 0; c < dv; ++c) dvr[c] += task_dv[c];
        }
    }
  }
  return out;
}

}  // namespace flashcheck
