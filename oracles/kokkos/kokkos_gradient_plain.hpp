// The plain (one work item per row or key) gradient kernels that let the GPU
// judge a backward case on every row, beside Algorithm 2's tiled kernels
// (kokkos_gradient_kernels.hpp):
//   - the conditioning of the f64 gradients (GradientRows::dq_terms_max and
//     the rest, core/gradients.hpp), which the tolerance's gradient floor
//     scales with: ConditioningPairs per (query row, key) of a chunk of rows,
//     RowConditioning per query row, then KeyConditioning per key row;
//   - the same-precision baseline, the plain backward rounded to the working
//     dtype after each step as cpu_lowp_gradients does it (the same steps in
//     the same order, so that on the host both give the same bits):
//     RoundedPairs per (query row, key) of a chunk of rows, RoundedRowState
//     per query row (the row's softmax state, D, and its dS), RoundedRowDq
//     per (query row, column), then RoundedKeyGradients per key row (dK and
//     dV, summed over the rows in index order, each head's sum rounded, then
//     the group's).
// A row's keys are many where its work items are few (a decode row walks
// 262144 keys): the pair kernels do each pair's dot products in parallel into
// a chunk's [rows][seqlen_kv] arrays, and the row kernels keep only their
// scans, in key order, one work item a row (or a row's dQ column), so the
// sums keep cpu_lowp's order. A key's work recomputes each (row, key) pair's
// logit and dP with the same inline code as the pair kernels: the same bits
// on the same space. The f32
// products and sums are never fused (multiply_rounded / add_rounded on a GPU,
// -ffp-contract=off on the host). A private header of oracles/kokkos: only
// Kokkos and the two kernel headers are included.
#pragma once

#include "flashcheck/oracles/kokkos/kokkos_attention.hpp"
#include "kokkos_gradient_kernels.hpp"

namespace flashcheck::kokkos_attention {

KOKKOS_INLINE_FUNCTION double finite_or_0(double x) { return finite(x) ? x : 0.0; }
KOKKOS_INLINE_FUNCTION double magnitude(double x) { return x < 0 ? -x : x; }

/// Per (batch, K/V head, key): max_c |K_jc| over the finite entries, and the
/// norm |k_j| (0 where it is not finite).
template <class Space>
struct KeyMagnitudes {
  DeviceArray<const double, 4> k;  // [batch][heads_kv][seqlen_kv][d]
  DeviceArray<double, 1> k_max, k_norm;  // [(b heads_kv + hk) seqlen_kv + j]
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t d = k.extent(3);
    const double* row = &k.data[index * d];
    double largest = 0, square = 0;
    for (std::int64_t c = 0; c < d; ++c) {
      if (finite(row[c]) && magnitude(row[c]) > largest) largest = magnitude(row[c]);
      square += row[c] * row[c];
    }
    k_max(index) = largest;
    k_norm(index) = finite(square) ? sqrt(square) : 0.0;
  }
};

/// What the conditioning kernels share: the operands, the key magnitudes and
/// each row's state (RowConditioning writes it, KeyConditioning reads it).
struct ConditioningOperands {
  GradientOperands in;
  DeviceArray<const double, 1> k_max, k_norm;
  // Per (batch, query head, row), flat [(b heads + h) seqlen_q + i]:
  //   row_c     = sqrt(d) scale |q_i| (a_ij = row_c |k_j|),
  //   row_shift = A_i + |LSE_i| (A_i = sum_k P_ik a_ik; |LSE_i| 0 where not finite),
  //   row_q_max = max_c |Q_ic|, row_do_max = max_c |dO_ic| (finite entries).
  DeviceArray<double, 1> row_c, row_shift, row_q_max, row_do_max;

  KOKKOS_INLINE_FUNCTION std::int64_t row_index(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * in.g.heads + h) * in.g.seqlen_q + i;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t key_index(std::int64_t b, std::int64_t hk, std::int64_t j) const {
    return (b * in.g.heads_kv + hk) * in.g.seqlen_kv + j;
  }
  /// P_ij from the row's LSE (the logit modified where the problem says), and dP_ij = dO_i . V_j.
  KOKKOS_INLINE_FUNCTION void pair(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t j,
                                   double& probability, double& dprobability) const {
    double dot = 0, dp = 0;
    for (std::int64_t c = 0; c < in.g.head_dim; ++c) dot += in.q(b, h, i, c) * in.k(b, hk, j, c);
    for (std::int64_t c = 0; c < in.g.head_dim_v; ++c) dp += in.dout(b, h, i, c) * in.v(b, hk, j, c);
    double logit = in.scale * dot;
    if (in.modify.active()) logit = in.modify(logit, h, i, j, in.len_q(b), in.len_kv(b));
    probability = exp(logit - in.lse(b, h, i));
    dprobability = dp;
  }
  /// a_ij = row_c |k_j| + |ALiBi's bias| (one more term of the logit, rounded once).
  KOKKOS_INLINE_FUNCTION double logit_terms(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j,
                                            double row_c, double k_norm_j) const {
    return row_c * k_norm_j + in.modify.bias_magnitude(h, i, j, in.len_q(b), in.len_kv(b));
  }
};

/// A chunk of query rows [row0, row0 + rows) (flat (b heads + h) seqlen_q + i)
/// and the (row, key) pairs of each row's visible keys: [rows][seqlen_kv],
/// the pair's values at [row - row0][j] (a masked pair's slot left unset).
struct RowChunk {
  std::int64_t row0 = 0, rows = 0;
};

/// Per (query row of a chunk, key): P_ij and dP_ij in f64 (ConditioningOperands::pair).
template <class Space>
struct ConditioningPairs {
  ConditioningOperands c;
  RowChunk chunk;
  DeviceArray<double, 2> probability, dprobability;  // [chunk rows][seqlen_kv]

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const GradientOperands& in = c.in;
    const std::int64_t r = index / in.g.seqlen_kv, j = index % in.g.seqlen_kv, row = chunk.row0 + r;
    const std::int64_t i = row % in.g.seqlen_q, h = row / in.g.seqlen_q % in.g.heads,
                       b = row / (in.g.seqlen_q * in.g.heads);
    const std::int64_t lq = in.len_q(b), lk = in.len_kv(b);
    std::int64_t begin = 0, end = 0;
    if (i < lq) in.mask.visible_keys(i, lq, lk, begin, end);
    if (j < begin || j >= end) return;
    c.pair(b, h, h / in.g.group, i, j, probability(r, j), dprobability(r, j));
  }
};

/// Per (batch, query head, query row) of a chunk: the row's state for
/// KeyConditioning, and its dQ terms, as cpu_f64_gradients takes them:
///   w_dq = scale sum_j g_ij max_c|K_jc|,  x_dq = scale sum_j g_ij e_ij max_c|K_jc|,
/// g_ij = P_ij (|dP_ij| + |D_i|), e_ij = a_ij + A_i + |LSE_i| (non-finite
/// terms count 0), P and dP from ConditioningPairs. Padding and fully masked
/// rows have no terms.
template <class Space>
struct RowConditioning {
  ConditioningOperands c;
  RowChunk chunk;
  DeviceArray<const double, 2> pair_probability, pair_dprobability;  // ConditioningPairs'
  DeviceArray<double, 1> w_dq, x_dq;  // flat as the row state

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t r) const {
    const GradientOperands& in = c.in;
    const std::int64_t index = chunk.row0 + r;
    const std::int64_t i = index % in.g.seqlen_q, h = index / in.g.seqlen_q % in.g.heads,
                       b = index / (in.g.seqlen_q * in.g.heads), hk = h / in.g.group;
    const std::int64_t lq = in.len_q(b), lk = in.len_kv(b);
    c.row_c(index) = c.row_shift(index) = c.row_q_max(index) = c.row_do_max(index) = 0;
    w_dq(index) = x_dq(index) = 0;
    std::int64_t begin = 0, end = 0;
    if (i < lq) in.mask.visible_keys(i, lq, lk, begin, end);
    if (begin == end) return;
    double q_square = 0, q_max = 0, do_max = 0;
    for (std::int64_t col = 0; col < in.g.head_dim; ++col) {
      const double x = in.q(b, h, i, col);
      q_square += x * x;
      if (finite(x) && magnitude(x) > q_max) q_max = magnitude(x);
    }
    for (std::int64_t col = 0; col < in.g.head_dim_v; ++col) {
      const double x = in.dout(b, h, i, col);
      if (finite(x) && magnitude(x) > do_max) do_max = magnitude(x);
    }
    const double row_c = sqrt(static_cast<double>(in.g.head_dim)) * in.scale * sqrt(q_square);
    double a_mean = 0;
    for (std::int64_t j = begin; j < end; ++j)
      a_mean += pair_probability(r, j) * c.logit_terms(b, h, i, j, row_c, c.k_norm(c.key_index(b, hk, j)));
    const double lse = in.lse(b, h, i), delta = magnitude(in.delta(b, h, i));
    const double shift = a_mean + (finite(lse) ? magnitude(lse) : 0.0);
    double w = 0, x = 0;
    for (std::int64_t j = begin; j < end; ++j) {
      const std::int64_t key = c.key_index(b, hk, j);
      const double g = finite_or_0(pair_probability(r, j) * (magnitude(pair_dprobability(r, j)) + delta));
      const double e = finite_or_0(c.logit_terms(b, h, i, j, row_c, c.k_norm(key)) + shift);
      w += g * c.k_max(key);
      x += g * e * c.k_max(key);
    }
    c.row_c(index) = row_c;
    c.row_shift(index) = shift;
    c.row_q_max(index) = q_max;
    c.row_do_max(index) = do_max;
    w_dq(index) = finite_or_0(in.scale * w);
    x_dq(index) = finite_or_0(in.scale * x);
  }
};

/// Per (batch, K/V head, computed key row): the key's terms, summed over the
/// query rows of every head of its group that see it:
///   [0] sum_i P_ij, [1] scale sum_i g_ij max|Q_i|, [2] scale sum_i g_ij e_ij max|Q_i|,
///   [3] sum_i P_ij max|dO_i|, [4] sum_i P_ij e_ij max|dO_i|.
template <class Space>
struct KeyConditioning {
  ConditioningOperands c;
  DeviceArray<const std::int64_t, 1> kv_position;  // the computed key rows
  DeviceArray<double, 4> sums;  // [batch][heads_kv][kv rows][5]

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const GradientOperands& in = c.in;
    const std::int64_t rows = kv_position.extent(0);
    const std::int64_t s = index % rows, hk = index / rows % in.g.heads_kv, b = index / (rows * in.g.heads_kv);
    const std::int64_t j = kv_position(s), lq = in.len_q(b), lk = in.len_kv(b);
    double total[5] = {0, 0, 0, 0, 0};
    if (j < lk) {
      const std::int64_t key = c.key_index(b, hk, j);
      for (std::int64_t g = 0; g < in.g.group; ++g) {
        const std::int64_t h = hk * in.g.group + g;
        for (std::int64_t i = 0; i < lq; ++i) {
          std::int64_t begin = 0, end = 0;
          in.mask.visible_keys(i, lq, lk, begin, end);
          if (j < begin || j >= end) continue;
          double probability, dprobability;
          c.pair(b, h, hk, i, j, probability, dprobability);
          const std::int64_t row = c.row_index(b, h, i);
          const double weight = finite_or_0(probability);
          const double terms = finite_or_0(probability * (magnitude(dprobability) + magnitude(in.delta(b, h, i))));
          const double e = finite_or_0(c.logit_terms(b, h, i, j, c.row_c(row), c.k_norm(key)) + c.row_shift(row));
          total[0] += weight;
          total[1] += terms * c.row_q_max(row);
          total[2] += terms * e * c.row_q_max(row);
          total[3] += weight * c.row_do_max(row);
          total[4] += weight * e * c.row_do_max(row);
        }
      }
    }
    sums(b, hk, s, 0) = total[0];
    sums(b, hk, s, 1) = finite_or_0(in.scale * total[1]);
    sums(b, hk, s, 2) = finite_or_0(in.scale * total[2]);
    sums(b, hk, s, 3) = total[3];
    sums(b, hk, s, 4) = total[4];
  }
};

/// What the rounded baseline's kernels share: the inputs in f32, rounded to
/// the working dtype, every row; each query row's softmax state and D.
struct RoundedOperands {
  DeviceArray<const float, 4> q, dout;  // [batch][heads][seqlen_q][d or dv]
  DeviceArray<const float, 4> k, v;     // [batch][heads_kv][seqlen_kv][d or dv]
  DeviceArray<const std::int64_t, 1> len_q, len_kv;
  // Per (batch, query head, row), flat [(b heads + h) seqlen_q + i]: the
  // maximum of the rounded logits, the sum of exp(s - maximum), D in f32.
  DeviceArray<float, 1> row_max, row_sum, row_delta;
  GradientGeometry g;
  MaskSpec mask;
  ScoreModSpec modify;
  StorageCode working = StorageCode::f32;
  float scale = 1, minus_infinity = 0, not_a_number = 0;

  KOKKOS_INLINE_FUNCTION std::int64_t row_index(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return (b * g.heads + h) * g.seqlen_q + i;
  }
  /// round(scale round-free dot(q_i, k_j)), then the score modifications as
  /// the baseline applies them (`t`: tanh(s / C) with a softcap): the logit as
  /// the forward baseline forms it.
  KOKKOS_INLINE_FUNCTION float logit(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t j,
                                     float* t = nullptr) const {
    float dot = 0;
    for (std::int64_t c = 0; c < g.head_dim; ++c) dot = add_rounded(dot, multiply_rounded(q(b, h, i, c), k(b, hk, j, c)));
    const float scaled = round_working(working, multiply_rounded(dot, scale));
    return modify.active() ? modified_rounded(modify, working, scaled, h, i, j, len_q(b), len_kv(b), t) : scaled;
  }
  /// round(dO_i . V_j).
  KOKKOS_INLINE_FUNCTION float dprobability(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                                            std::int64_t j) const {
    float dot = 0;
    for (std::int64_t c = 0; c < g.head_dim_v; ++c)
      dot = add_rounded(dot, multiply_rounded(dout(b, h, i, c), v(b, hk, j, c)));
    return round_working(working, dot);
  }
  /// P_ij = round(exp(s - maximum) / sum) from the row's state.
  KOKKOS_INLINE_FUNCTION float probability(std::int64_t row, float s) const {
    return round_working(working, divide_rounded(exp(add_rounded(s, -row_max(row))), row_sum(row)));
  }
  /// dS'_ij = round(scale round(P (dP - D))), with a softcap
  /// round(scale round(round(P (dP - D)) round(1 - round(t^2)))).
  KOKKOS_INLINE_FUNCTION float dscore(std::int64_t row, float probability, float dp, float t) const {
    float product = round_working(working, multiply_rounded(probability, add_rounded(dp, -row_delta(row))));
    if (modify.softcap > 0) {
      const float chain = round_working(working, add_rounded(1.0f, -round_working(working, multiply_rounded(t, t))));
      product = round_working(working, multiply_rounded(product, chain));
    }
    return round_working(working, multiply_rounded(scale, product));
  }
};

/// Per (query row of a chunk, key): the rounded logit (and, with a softcap,
/// its tanh) and dP, as RoundedOperands::logit and ::dprobability give them.
template <class Space>
struct RoundedPairs {
  RoundedOperands r;
  RowChunk chunk;
  DeviceArray<float, 2> logit, tanh_value, dprobability;  // [chunk rows][seqlen_kv]; tanh_value only with a softcap

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t p = index / r.g.seqlen_kv, j = index % r.g.seqlen_kv, row = chunk.row0 + p;
    const std::int64_t i = row % r.g.seqlen_q, h = row / r.g.seqlen_q % r.g.heads, b = row / (r.g.seqlen_q * r.g.heads);
    const std::int64_t lq = r.len_q(b), lk = r.len_kv(b);
    std::int64_t begin = 0, end = 0;
    if (i < lq) r.mask.visible_keys(i, lq, lk, begin, end);
    if (j < begin || j >= end) return;
    float t = 0;
    logit(p, j) = r.logit(b, h, h / r.g.group, i, j, &t);
    if (r.modify.softcap > 0) tanh_value(p, j) = t;
    dprobability(p, j) = r.dprobability(b, h, h / r.g.group, i, j);
  }
};

/// Per (batch, query head, query row) of a chunk: the row's softmax state
/// and D from RoundedPairs' logits and dP (f32 sums in key order), and, where
/// `dq_slot` asks for the row's dQ (-1: not asked for), dS'_ij written over
/// the row's logits for RoundedRowDq. Padding and fully masked rows: no state
/// (sum 0).
template <class Space>
struct RoundedRowState {
  RoundedOperands r;
  RowChunk chunk;
  DeviceArray<const std::int64_t, 1> dq_slot;  // [seqlen_q]: the row's slot in dq, or -1
  DeviceArray<float, 2> logit;                 // RoundedPairs', then dS' where the row's dQ is asked for
  DeviceArray<const float, 2> tanh_value, dprobability;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t p) const {
    const std::int64_t index = chunk.row0 + p;
    const std::int64_t i = index % r.g.seqlen_q, b = index / (r.g.seqlen_q * r.g.heads);
    const std::int64_t lq = r.len_q(b), lk = r.len_kv(b);
    r.row_max(index) = r.minus_infinity;
    r.row_sum(index) = 0;
    r.row_delta(index) = 0;
    std::int64_t begin = 0, end = 0;
    if (i < lq) r.mask.visible_keys(i, lq, lk, begin, end);
    if (begin == end) return;
    float maximum = r.minus_infinity;
    bool saw_nan = false;
    for (std::int64_t j = begin; j < end; ++j) {
      const float s = logit(p, j);
      saw_nan = saw_nan || s != s;
      maximum = maximum < s ? s : maximum;
    }
    if (saw_nan) maximum = r.not_a_number;
    float sum = 0;
    for (std::int64_t j = begin; j < end; ++j) sum = add_rounded(sum, exp(add_rounded(logit(p, j), -maximum)));
    r.row_max(index) = maximum;
    r.row_sum(index) = sum;
    float delta = 0;
    for (std::int64_t j = begin; j < end; ++j)
      delta = add_rounded(delta, multiply_rounded(r.probability(index, logit(p, j)), dprobability(p, j)));
    r.row_delta(index) = delta;
    if (dq_slot(i) < 0) return;
    for (std::int64_t j = begin; j < end; ++j) {
      const float t = r.modify.softcap > 0 ? tanh_value(p, j) : 0.0f;
      logit(p, j) = r.dscore(index, r.probability(index, logit(p, j)), dprobability(p, j), t);
    }
  }
};

/// Per (query row of a chunk, column c) where `dq_slot` asks for the row:
/// dQ_ic = round(sum_j dS'_ij K_jc), the f32 sum in key order (RoundedRowState's
/// dS'). Padding and fully masked rows: dQ = 0.
template <class Space>
struct RoundedRowDq {
  RoundedOperands r;
  RowChunk chunk;
  DeviceArray<const std::int64_t, 1> dq_slot;
  DeviceArray<const float, 2> dscore;  // RoundedRowState's
  DeviceArray<float, 4> dq;            // [batch][heads][q rows][d]

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t item) const {
    const std::int64_t p = item / r.g.head_dim, c = item % r.g.head_dim, index = chunk.row0 + p;
    const std::int64_t i = index % r.g.seqlen_q, h = index / r.g.seqlen_q % r.g.heads,
                       b = index / (r.g.seqlen_q * r.g.heads), hk = h / r.g.group;
    const std::int64_t lq = r.len_q(b), lk = r.len_kv(b), slot = dq_slot(i);
    if (slot < 0) return;
    std::int64_t begin = 0, end = 0;
    if (i < lq) r.mask.visible_keys(i, lq, lk, begin, end);
    float sum = 0;
    for (std::int64_t j = begin; j < end; ++j) sum = add_rounded(sum, multiply_rounded(dscore(p, j), r.k(b, hk, j, c)));
    dq(b, h, slot, c) = begin == end ? 0.0f : round_working(r.working, sum);
  }
};

/// Per (batch, K/V head, computed key row): dV = sum_i P_ij dO_i and
/// dK = sum_i dS'_ij Q_i, each head's f32 sum over its rows in index order
/// rounded, the group's heads added in order, the total rounded. `head_dk`
/// and `head_dv` hold each work item's running head sums.
template <class Space>
struct RoundedKeyGradients {
  RoundedOperands r;
  DeviceArray<const std::int64_t, 1> kv_position;
  DeviceArray<float, 4> dk, dv, head_dk, head_dv;  // [batch][heads_kv][kv rows][d or dv]

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t rows = kv_position.extent(0);
    const std::int64_t s = index % rows, hk = index / rows % r.g.heads_kv, b = index / (rows * r.g.heads_kv);
    const std::int64_t j = kv_position(s), lq = r.len_q(b), lk = r.len_kv(b);
    for (std::int64_t c = 0; c < r.g.head_dim; ++c) dk(b, hk, s, c) = 0;
    for (std::int64_t c = 0; c < r.g.head_dim_v; ++c) dv(b, hk, s, c) = 0;
    if (j >= lk) return;
    for (std::int64_t g = 0; g < r.g.group; ++g) {
      const std::int64_t h = hk * r.g.group + g;
      for (std::int64_t c = 0; c < r.g.head_dim; ++c) head_dk(b, hk, s, c) = 0;
      for (std::int64_t c = 0; c < r.g.head_dim_v; ++c) head_dv(b, hk, s, c) = 0;
      for (std::int64_t i = 0; i < lq; ++i) {
        std::int64_t begin = 0, end = 0;
        r.mask.visible_keys(i, lq, lk, begin, end);
        if (j < begin || j >= end) continue;  // masked: absent
        const std::int64_t row = r.row_index(b, h, i);
        float t = 0;
        const float probability = r.probability(row, r.logit(b, h, hk, i, j, &t));
        const float ds = r.dscore(row, probability, r.dprobability(b, h, hk, i, j), t);
        for (std::int64_t c = 0; c < r.g.head_dim_v; ++c)
          head_dv(b, hk, s, c) = add_rounded(head_dv(b, hk, s, c), multiply_rounded(probability, r.dout(b, h, i, c)));
        for (std::int64_t c = 0; c < r.g.head_dim; ++c)
          head_dk(b, hk, s, c) = add_rounded(head_dk(b, hk, s, c), multiply_rounded(ds, r.q(b, h, i, c)));
      }
      for (std::int64_t c = 0; c < r.g.head_dim; ++c)
        dk(b, hk, s, c) = add_rounded(dk(b, hk, s, c), round_working(r.working, head_dk(b, hk, s, c)));
      for (std::int64_t c = 0; c < r.g.head_dim_v; ++c)
        dv(b, hk, s, c) = add_rounded(dv(b, hk, s, c), round_working(r.working, head_dv(b, hk, s, c)));
    }
    for (std::int64_t c = 0; c < r.g.head_dim; ++c) dk(b, hk, s, c) = round_working(r.working, dk(b, hk, s, c));
    for (std::int64_t c = 0; c < r.g.head_dim_v; ++c) dv(b, hk, s, c) = round_working(r.working, dv(b, hk, s, c));
  }
};

}  // namespace flashcheck::kokkos_attention
