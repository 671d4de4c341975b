// The backward pass's result form: dQ, dK and dV on sets of rows, in f64, as
// the gradient oracles give them and the subjects' gradients are compared in
// (the backward twin of AttentionRows).
#pragma once

#include <cstdint>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

/// dQ on the query rows `q_rows` of every (batch, query head); dK and dV on
/// the key rows `kv_rows` of every (batch, K/V head), each summed over the
/// query heads of its GQA group and over every query row:
///   dq [batch][heads_q][q_row][d], dk [batch][heads_kv][kv_row][d],
///   dv [batch][heads_kv][kv_row][dv].
/// Rows past a sequence's valid length are padding: their entries stay 0.
struct GradientRows {
  RowSet q_rows, kv_rows;
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, dim = 0, dim_v = 0;
  std::vector<double> dq, dk, dv;
  /// The conditioning of the gradients, where the f64 oracle records it (0:
  /// not recorded), over the rows held. With g_ij = P_ij (|dP_ij| + |D_i|)
  /// (the terms of dS = P (dP - D) before they cancel) and
  /// e_ij = a_ij + sum_k P_ik a_ik + |LSE_i|, a_ij = sqrt(d) scale |q_i| |k_j|
  /// (a bound on sqrt(d) times logit (i, j)'s absolute condition: P_ij moves
  /// by about u_f32 e_ij P_ij when S and LSE are rounded to f32):
  ///   dq_terms_max       = max_i scale sum_j g_ij max_c|K_jc|
  ///   dq_logit_terms_max = max_i scale sum_j g_ij e_ij max_c|K_jc|
  ///   dk_terms_max       = max_j scale sum_i g_ij max_c|Q_ic|   (i over the group's rows)
  ///   dk_logit_terms_max = max_j scale sum_i g_ij e_ij max_c|Q_ic|
  ///   dv_terms_max       = max_j sum_i P_ij max_c|dO_ic|
  ///   dv_logit_terms_max = max_j sum_i P_ij e_ij max_c|dO_ic|
  ///   key_weight_max     = max_j sum_i P_ij
  /// dS cancels where dP is close to D (dO nearly the same over the keys): a
  /// gradient is then small and its rounding errors are not; they scale with
  /// these (tolerance.hpp's gradient floor).
  double dq_terms_max = 0, dk_terms_max = 0, dv_terms_max = 0;
  double dq_logit_terms_max = 0, dk_logit_terms_max = 0, dv_logit_terms_max = 0;
  double key_weight_max = 0;

  GradientRows() = default;
  GradientRows(const Problem& problem, RowSet q, RowSet kv);
  std::int64_t q_index(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return (b * heads_q + h) * q_rows.size() + r;
  }
  std::int64_t kv_index(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return (b * heads_kv + h) * kv_rows.size() + r;
  }
  double* dq_row(std::int64_t b, std::int64_t h, std::int64_t r) { return dq.data() + q_index(b, h, r) * dim; }
  double* dk_row(std::int64_t b, std::int64_t h, std::int64_t r) { return dk.data() + kv_index(b, h, r) * dim; }
  double* dv_row(std::int64_t b, std::int64_t h, std::int64_t r) { return dv.data() + kv_index(b, h, r) * dim_v; }
  const double* dq_row(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return dq.data() + q_index(b, h, r) * dim;
  }
  const double* dk_row(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return dk.data() + kv_index(b, h, r) * dim;
  }
  const double* dv_row(std::int64_t b, std::int64_t h, std::int64_t r) const {
    return dv.data() + kv_index(b, h, r) * dim_v;
  }
};

/// Every key row.
RowSet all_key_rows(const Problem& problem);
/// About `count` key rows, chosen as sample_rows chooses query rows (first and
/// last of the padded and of every valid length, tile edges, the rest from
/// `seed`), over seqlen_kv and the per-sequence key lengths.
RowSet sample_key_rows(const Problem& problem, std::int64_t count, std::uint64_t seed);

}  // namespace flashcheck
