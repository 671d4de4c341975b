// The Kokkos gradient reference's host side: Q, K, V and dO staged in the
// space's memory and decoded to f64; the f64 forward (the forward reference's
// online-softmax kernel) for O and LSE on every query row; D = rowsum(dO o O);
// the two gradient kernels of kokkos_gradient_kernels.hpp; the gradients
// copied back into GradientRows. Beside them, where asked, the conditioning
// of the gradients, and the same-precision baseline (kokkos_gradient_plain.hpp).
#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "flashcheck/oracles/kokkos/kokkos_attention.hpp"
#include "kokkos_gradient_kernels.hpp"
#include "kokkos_gradient_plain.hpp"
#include "kokkos_host.hpp"

namespace flashcheck {
namespace {

namespace ka = kokkos_attention;
using namespace kokkos_host;

template <class Space>
using DeviceRows = Kokkos::View<double****, Kokkos::LayoutRight, Space>;

// A sorted row set in the space's memory.
template <class Space>
Kokkos::View<std::int64_t*, Space> positions(const RowSet& rows, const char* label) {
  Kokkos::View<std::int64_t*, Space> view(std::string(label), extent(rows.size()));
  auto host = Kokkos::create_mirror_view(view);
  for (std::int64_t r = 0; r < rows.size(); ++r) host(r) = rows.rows[r];
  Kokkos::deep_copy(view, host);
  return view;
}

template <class Space>
ka::GradientTiles<Space> tiles_for(const Problem& p, KokkosTiling tiling) {
  ka::GradientTiles<Space> tiles;
  tiles.in.g = {p.batch, p.heads_q, p.heads_kv, p.group_size(), p.seqlen_q, p.seqlen_kv, p.head_dim, p.head_dim_v};
  tiles.tile_rows = tiling.rows_per_team;
  tiles.tile_keys = tiling.key_tile;
  tiles.prepare_tiles();
  return tiles;
}

template <class Space>
KokkosTiling fit_gradients(const Problem& p, KokkosTiling tiling) {
  if (tiling.rows_per_team < 1 || tiling.rows_per_team > kMaxTile || tiling.key_tile < 1 ||
      tiling.key_tile > kMaxTile || tiling.team_size < 0)
    throw std::invalid_argument("Kokkos tiling: rows_per_team and key_tile must be in [1, " + text(kMaxTile) +
                                "], team_size >= 0");
  if (tiling.team_size == 0)
    tiling.team_size = std::is_same_v<Space, Kokkos::DefaultHostExecutionSpace> ? 1 : kGpuTeamSize;
  const auto limit = static_cast<std::size_t>(Kokkos::TeamPolicy<Space>::scratch_size_max(0));
  while (tiles_for<Space>(p, tiling).scratch_bytes() > limit) {
    if (tiling.rows_per_team > 4) tiling.rows_per_team /= 2;
    else if (tiling.key_tile > 4) tiling.key_tile /= 2;
    else
      throw std::invalid_argument("Kokkos tiling: no gradient tile fits the team scratch (" +
                                  text(static_cast<std::int64_t>(limit)) + " bytes)");
  }
  return tiling;
}

// Per row of a decoded tensor: whether it is all finite.
template <class Space>
Kokkos::View<int*, Space> finite_rows(const DeviceRows<Space>& tensor, const char* label) {
  Kokkos::View<int*, Space> finite(std::string(label), extent(tensor.extent(0) * tensor.extent(1) * tensor.extent(2)));
  Kokkos::parallel_for("flashcheck::kokkos::finite_rows", Kokkos::RangePolicy<Space>(0, finite.size()),
                       MarkFiniteRows<Space, double>{ka::device_array<const double>(tensor), ka::device_array<int>(finite)});
  return finite;
}

// Query rows a chunk of the row kernels holds: pair_budget (row, key) pairs, at least one row.
std::int64_t chunk_rows(const Problem& p, std::int64_t pair_budget) {
  if (pair_budget < 1) throw std::invalid_argument("Kokkos gradients: pair_budget must be at least 1");
  const std::int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  return std::max<std::int64_t>(1, std::min(rows, pair_budget / std::max<std::int64_t>(1, p.seqlen_kv)));
}

// Runs a team kernel with the tiling's team size (or the most the kernel allows).
template <class Space, class Kernel>
void launch(const char* label, const Kernel& kernel, std::int64_t team_size) {
  if (kernel.league_size() == 0) return;
  Kokkos::TeamPolicy<Space> policy(kernel.league_size(), static_cast<int>(team_size));
  const int team_max = policy.team_size_max(kernel, Kokkos::ParallelForTag());
  if (team_size > team_max) policy = Kokkos::TeamPolicy<Space>(kernel.league_size(), team_max);
  policy.set_scratch_size(0, Kokkos::PerTeam(kernel.scratch_bytes()));
  Kokkos::parallel_for(label, policy, kernel);
}

// The conditioning of the gradients (GradientRows::dq_terms_max and the
// rest): dQ's terms over the query rows of `q_rows`, dK's and dV's over the
// key rows of `kv_position`, as cpu_f64_gradients takes them.
template <class Space>
void conditioning(const Problem& p, const ka::GradientOperands& operands, const DeviceRows<Space>& k,
                  const RowSet& q_rows, const Kokkos::View<std::int64_t*, Space>& kv_position, std::int64_t pair_budget,
                  GradientRows& out) {
  using Flat = Kokkos::View<double*, Space>;
  const std::int64_t keys = p.batch * p.heads_kv * p.seqlen_kv, rows = p.batch * p.heads_q * p.seqlen_q;
  const Flat k_max("k_max", extent(keys)), k_norm("k_norm", extent(keys));
  Kokkos::parallel_for("flashcheck::kokkos::key_magnitudes", Kokkos::RangePolicy<Space>(0, keys),
                       ka::KeyMagnitudes<Space>{ka::device_array<const double>(k), ka::device_array<double>(k_max),
                                                ka::device_array<double>(k_norm)});
  const Flat row_c("row_c", extent(rows)), row_shift("row_shift", extent(rows)), row_q_max("row_q_max", extent(rows)),
      row_do_max("row_do_max", extent(rows)), w_dq("w_dq", extent(rows)), x_dq("x_dq", extent(rows));
  const ka::ConditioningOperands c{operands,
                                   ka::device_array<const double>(k_max),
                                   ka::device_array<const double>(k_norm),
                                   ka::device_array<double>(row_c),
                                   ka::device_array<double>(row_shift),
                                   ka::device_array<double>(row_q_max),
                                   ka::device_array<double>(row_do_max)};
  // Per chunk of query rows: each (row, key) pair's P and dP in parallel, then the rows' sums in key order.
  const std::int64_t chunk = chunk_rows(p, pair_budget);
  const Kokkos::View<double**, Kokkos::LayoutRight, Space> probability("pair_p", extent(chunk), extent(p.seqlen_kv)),
      dprobability("pair_dp", extent(chunk), extent(p.seqlen_kv));
  for (std::int64_t row0 = 0; row0 < rows; row0 += chunk) {
    const ka::RowChunk part{row0, std::min(chunk, rows - row0)};
    Kokkos::parallel_for("flashcheck::kokkos::conditioning_pairs", Kokkos::RangePolicy<Space>(0, part.rows * p.seqlen_kv),
                         ka::ConditioningPairs<Space>{c, part, ka::device_array<double>(probability),
                                                      ka::device_array<double>(dprobability)});
    Kokkos::parallel_for("flashcheck::kokkos::row_conditioning", Kokkos::RangePolicy<Space>(0, part.rows),
                         ka::RowConditioning<Space>{c, part, ka::device_array<const double>(probability),
                                                    ka::device_array<const double>(dprobability),
                                                    ka::device_array<double>(w_dq), ka::device_array<double>(x_dq)});
  }
  const std::int64_t kv_rows = static_cast<std::int64_t>(kv_position.extent(0));
  const Kokkos::View<double****, Kokkos::LayoutRight, Space> sums("key_terms", extent(p.batch), extent(p.heads_kv),
                                                                  extent(kv_rows), 5);
  if (kv_rows > 0)
    Kokkos::parallel_for("flashcheck::kokkos::key_conditioning", Kokkos::RangePolicy<Space>(0, p.batch * p.heads_kv * kv_rows),
                         ka::KeyConditioning<Space>{c, ka::device_array<const std::int64_t>(kv_position),
                                                    ka::device_array<double>(sums)});
  Kokkos::fence();
  const auto w_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), w_dq);
  const auto x_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x_dq);
  const auto sums_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), sums);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < q_rows.size(); ++r) {
        const std::int64_t at = (b * p.heads_q + h) * p.seqlen_q + q_rows.rows[r];
        out.dq_terms_max = std::max(out.dq_terms_max, w_host(at));
        out.dq_logit_terms_max = std::max(out.dq_logit_terms_max, x_host(at));
      }
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t r = 0; r < kv_rows; ++r) {
        out.key_weight_max = std::max(out.key_weight_max, sums_host(b, hk, r, 0));
        out.dk_terms_max = std::max(out.dk_terms_max, sums_host(b, hk, r, 1));
        out.dk_logit_terms_max = std::max(out.dk_logit_terms_max, sums_host(b, hk, r, 2));
        out.dv_terms_max = std::max(out.dv_terms_max, sums_host(b, hk, r, 3));
        out.dv_logit_terms_max = std::max(out.dv_logit_terms_max, sums_host(b, hk, r, 4));
      }
}

template <class Space>
GradientRows algorithm2(const Problem& p, const Inputs& in, const HostTensor& dout, const RowSet& q_rows,
                        const RowSet& kv_rows, KokkosTiling requested, bool with_condition, std::int64_t pair_budget) {
  const KokkosTiling tiling = fit_gradients<Space>(p, requested);
  GradientRows out(p, q_rows, kv_rows);
  if (p.batch == 0 || (q_rows.size() == 0 && kv_rows.size() == 0)) return out;

  // Every query row's forward, whatever rows are asked for: dK and dV sum over all of them.
  const RowSet every = all_rows(p);
  const RowGeometry<Space> geometry(p, every);
  const auto q = stage<Space, double>(in.q, "q", {}, p.seqlen_q);
  const auto k = stage<Space, double>(in.k, "k", {}, p.seqlen_kv);
  const auto v = stage<Space, double>(in.v, "v", {}, p.seqlen_kv);
  const auto dout_rows = stage<Space, double>(dout, "dout", {}, p.seqlen_q);
  const auto q_finite = finite_rows<Space>(q, "q_finite"), k_finite = finite_rows<Space>(k, "k_finite"),
             v_finite = finite_rows<Space>(v, "v_finite"), dout_finite = finite_rows<Space>(dout_rows, "dout_finite");

  // 1. O and LSE in f64 by the forward reference's kernel (online softmax).
  const KokkosTiling forward_tiling = fit<Space, double>(p, KokkosTiling{});
  auto forward = make_kernel<Space, double>(p, p.seqlen_q, forward_tiling);
  forward.q = ka::device_array<const double>(q);
  forward.k = ka::device_array<const double>(k);
  forward.v = ka::device_array<const double>(v);
  forward.v_row_finite = ka::device_array<const int>(v_finite);
  forward.position = ka::device_array<const std::int64_t>(geometry.position);
  forward.len_q = ka::device_array<const std::int64_t>(geometry.len_q);
  forward.len_kv = ka::device_array<const std::int64_t>(geometry.len_kv);
  const DeviceRows<Space> o("o", extent(p.batch), extent(p.heads_q), extent(p.seqlen_q), extent(p.head_dim_v));
  const Kokkos::View<double***, Kokkos::LayoutRight, Space> lse("lse", extent(p.batch), extent(p.heads_q),
                                                                extent(p.seqlen_q));
  forward.o = ka::device_array<double>(o);
  forward.lse = ka::device_array<double>(lse);
  launch<Space>("flashcheck::kokkos::gradient_forward", forward, forward_tiling.team_size);

  // 2. D = rowsum(dO o O).
  const Kokkos::View<double***, Kokkos::LayoutRight, Space> delta("delta", extent(p.batch), extent(p.heads_q),
                                                                  extent(p.seqlen_q));
  Kokkos::parallel_for("flashcheck::kokkos::row_delta", Kokkos::RangePolicy<Space>(0, delta.size()),
                       ka::RowDelta<Space>{ka::device_array<const double>(dout_rows), ka::device_array<const double>(o),
                                           ka::device_array<double>(delta)});

  ka::GradientOperands operands;
  operands.q = ka::device_array<const double>(q);
  operands.dout = ka::device_array<const double>(dout_rows);
  operands.k = ka::device_array<const double>(k);
  operands.v = ka::device_array<const double>(v);
  operands.lse = ka::device_array<const double>(lse);
  operands.delta = ka::device_array<const double>(delta);
  operands.q_finite = ka::device_array<const int>(q_finite);
  operands.dout_finite = ka::device_array<const int>(dout_finite);
  operands.k_finite = ka::device_array<const int>(k_finite);
  operands.v_finite = ka::device_array<const int>(v_finite);
  operands.len_q = ka::device_array<const std::int64_t>(geometry.len_q);
  operands.len_kv = ka::device_array<const std::int64_t>(geometry.len_kv);
  operands.g = tiles_for<Space>(p, tiling).in.g;
  operands.mask = mask_spec(p);
  operands.modify = score_mod(p);
  operands.scale = p.softmax_scale;

  // 3. dK and dV: a team per block of key rows.
  const auto kv_position = positions<Space>(kv_rows, "kv_position");
  const DeviceRows<Space> dk("dk", extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim));
  const DeviceRows<Space> dv("dv", extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim_v));
  if (kv_rows.size() > 0) {
    ka::KeyBlockGradients<Space> key_blocks;
    key_blocks.in = operands;
    key_blocks.tile_rows = tiling.rows_per_team;
    key_blocks.tile_keys = tiling.key_tile;
    key_blocks.kv_position = ka::device_array<const std::int64_t>(kv_position);
    key_blocks.dk = ka::device_array<double>(dk);
    key_blocks.dv = ka::device_array<double>(dv);
    key_blocks.prepare();
    launch<Space>("flashcheck::kokkos::key_block_gradients", key_blocks, tiling.team_size);
  }

  // 4. dQ: a team per block of query rows.
  const auto q_position = positions<Space>(q_rows, "q_position");
  const DeviceRows<Space> dq("dq", extent(p.batch), extent(p.heads_q), extent(q_rows.size()), extent(p.head_dim));
  if (q_rows.size() > 0) {
    ka::QueryBlockGradient<Space> query_blocks;
    query_blocks.in = operands;
    query_blocks.tile_rows = tiling.rows_per_team;
    query_blocks.tile_keys = tiling.key_tile;
    query_blocks.q_position = ka::device_array<const std::int64_t>(q_position);
    query_blocks.dq = ka::device_array<double>(dq);
    query_blocks.prepare();
    launch<Space>("flashcheck::kokkos::query_block_gradient", query_blocks, tiling.team_size);
  }
  if (with_condition) conditioning<Space>(p, operands, k, q_rows, kv_position, pair_budget, out);
  Kokkos::fence();

  // GradientRows has the kernels' order: [b][h][row][d or dv].
  using HostRows = Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  Kokkos::deep_copy(HostRows(out.dq.data(), extent(p.batch), extent(p.heads_q), extent(q_rows.size()), extent(p.head_dim)), dq);
  Kokkos::deep_copy(HostRows(out.dk.data(), extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim)), dk);
  Kokkos::deep_copy(HostRows(out.dv.data(), extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim_v)),
                    dv);
  return out;
}

// The plain backward rounded to `working` after each step (cpu_lowp_gradients'
// steps), dQ on `q_rows`, dK and dV on `kv_rows`.
template <class Space>
GradientRows rounded_backward(const Problem& p, const Inputs& in, const HostTensor& dout, const RowSet& q_rows,
                              const RowSet& kv_rows, DType working, std::int64_t pair_budget) {
  GradientRows out(p, q_rows, kv_rows);
  if (p.batch == 0 || (q_rows.size() == 0 && kv_rows.size() == 0)) return out;
  const RowGeometry<Space> geometry(p, all_rows(p));
  ka::RoundedOperands r;
  r.g = tiles_for<Space>(p, KokkosTiling{}).in.g;
  r.mask = mask_spec(p);
  r.modify = score_mod(p);
  r.working = storage_code(working);
  r.scale = static_cast<float>(p.softmax_scale);
  r.minus_infinity = -std::numeric_limits<float>::infinity();
  r.not_a_number = std::numeric_limits<float>::quiet_NaN();
  // Inputs in f32 (exact), rounded to the working dtype when it is narrower.
  const auto q = stage_rounded<Space>(in.q, "q", {}, p.seqlen_q, r.working);
  const auto k = stage_rounded<Space>(in.k, "k", {}, p.seqlen_kv, r.working);
  const auto v = stage_rounded<Space>(in.v, "v", {}, p.seqlen_kv, r.working);
  const auto dout_rows = stage_rounded<Space>(dout, "dout", {}, p.seqlen_q, r.working);
  r.q = ka::device_array<const float>(q);
  r.k = ka::device_array<const float>(k);
  r.v = ka::device_array<const float>(v);
  r.dout = ka::device_array<const float>(dout_rows);
  r.len_q = ka::device_array<const std::int64_t>(geometry.len_q);
  r.len_kv = ka::device_array<const std::int64_t>(geometry.len_kv);
  const std::int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const Kokkos::View<float*, Space> row_max("row_max", extent(rows)), row_sum("row_sum", extent(rows)),
      row_delta("row_delta", extent(rows));
  r.row_max = ka::device_array<float>(row_max);
  r.row_sum = ka::device_array<float>(row_sum);
  r.row_delta = ka::device_array<float>(row_delta);

  // Per query row: the softmax state, D and dQ.
  const Kokkos::View<std::int64_t*, Space> dq_slot("dq_slot", extent(p.seqlen_q));
  {
    auto slot_host = Kokkos::create_mirror_view(dq_slot);
    for (std::int64_t i = 0; i < p.seqlen_q; ++i) slot_host(i) = -1;
    for (std::int64_t slot = 0; slot < q_rows.size(); ++slot) slot_host(q_rows.rows[slot]) = slot;
    Kokkos::deep_copy(dq_slot, slot_host);
  }
  using Rows = Kokkos::View<float****, Kokkos::LayoutRight, Space>;
  const Rows dq("dq", extent(p.batch), extent(p.heads_q), extent(q_rows.size()), extent(p.head_dim));
  // Per chunk of query rows: each (row, key) pair's logit and dP in parallel, the rows' scans in key
  // order, then each dQ column's sum in key order.
  const std::int64_t chunk = chunk_rows(p, pair_budget);
  using Pairs = Kokkos::View<float**, Kokkos::LayoutRight, Space>;
  const Pairs logit("pair_logit", extent(chunk), extent(p.seqlen_kv)),
      dprobability("pair_dp", extent(chunk), extent(p.seqlen_kv)),
      tanh_value("pair_tanh", extent(p.softcap > 0 ? chunk : 0), extent(p.softcap > 0 ? p.seqlen_kv : 0));
  for (std::int64_t row0 = 0; row0 < rows; row0 += chunk) {
    const ka::RowChunk part{row0, std::min(chunk, rows - row0)};
    Kokkos::parallel_for("flashcheck::kokkos::rounded_pairs", Kokkos::RangePolicy<Space>(0, part.rows * p.seqlen_kv),
                         ka::RoundedPairs<Space>{r, part, ka::device_array<float>(logit), ka::device_array<float>(tanh_value),
                                                 ka::device_array<float>(dprobability)});
    Kokkos::parallel_for("flashcheck::kokkos::rounded_row_state", Kokkos::RangePolicy<Space>(0, part.rows),
                         ka::RoundedRowState<Space>{r, part, ka::device_array<const std::int64_t>(dq_slot),
                                                    ka::device_array<float>(logit), ka::device_array<const float>(tanh_value),
                                                    ka::device_array<const float>(dprobability)});
    if (q_rows.size() > 0)
      Kokkos::parallel_for("flashcheck::kokkos::rounded_row_dq", Kokkos::RangePolicy<Space>(0, part.rows * p.head_dim),
                           ka::RoundedRowDq<Space>{r, part, ka::device_array<const std::int64_t>(dq_slot),
                                                   ka::device_array<const float>(logit), ka::device_array<float>(dq)});
  }
  // Per key row: dK and dV.
  const auto kv_position = positions<Space>(kv_rows, "kv_position");
  const Rows dk("dk", extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim)),
      dv("dv", extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim_v)),
      head_dk("head_dk", extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim)),
      head_dv("head_dv", extent(p.batch), extent(p.heads_kv), extent(kv_rows.size()), extent(p.head_dim_v));
  if (kv_rows.size() > 0)
    Kokkos::parallel_for("flashcheck::kokkos::rounded_key_gradients",
                         Kokkos::RangePolicy<Space>(0, p.batch * p.heads_kv * kv_rows.size()),
                         ka::RoundedKeyGradients<Space>{r, ka::device_array<const std::int64_t>(kv_position),
                                                        ka::device_array<float>(dk), ka::device_array<float>(dv),
                                                        ka::device_array<float>(head_dk), ka::device_array<float>(head_dv)});
  Kokkos::fence();
  const auto widen = [](const Rows& rows_view, std::vector<double>& target) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rows_view);
    for (std::size_t n = 0; n < target.size(); ++n) target[n] = static_cast<double>(host.data()[n]);
  };
  widen(dq, out.dq);
  widen(dk, out.dk);
  widen(dv, out.dv);
  return out;
}

// Every kernel holds DeviceArrays, never a View (kokkos_attention.hpp says why).
template <class Space>
constexpr bool gradient_kernels_hold_no_view =
    std::is_trivially_copyable_v<ka::KeyBlockGradients<Space>> &&
    std::is_trivially_copyable_v<ka::QueryBlockGradient<Space>> && std::is_trivially_copyable_v<ka::RowDelta<Space>> &&
    std::is_trivially_copyable_v<ka::KeyMagnitudes<Space>> && std::is_trivially_copyable_v<ka::ConditioningPairs<Space>> &&
    std::is_trivially_copyable_v<ka::RowConditioning<Space>> && std::is_trivially_copyable_v<ka::KeyConditioning<Space>> &&
    std::is_trivially_copyable_v<ka::RoundedPairs<Space>> && std::is_trivially_copyable_v<ka::RoundedRowState<Space>> &&
    std::is_trivially_copyable_v<ka::RoundedRowDq<Space>> &&
    std::is_trivially_copyable_v<ka::RoundedKeyGradients<Space>>;
static_assert(gradient_kernels_hold_no_view<Kokkos::DefaultHostExecutionSpace>, "a Kokkos gradient kernel holds a View");
#ifdef KOKKOS_ENABLE_CUDA
static_assert(gradient_kernels_hold_no_view<Kokkos::Cuda>, "a Kokkos gradient kernel holds a View");
#endif

}  // namespace

KokkosTiling kokkos_fitted_gradient_tiling(const Problem& problem, KokkosTiling tiling, KokkosSpace space) {
  require_runtime(space);
#ifdef KOKKOS_ENABLE_CUDA
  if (space == KokkosSpace::device) return fit_gradients<Kokkos::Cuda>(problem, tiling);
#endif
  return fit_gradients<Kokkos::DefaultHostExecutionSpace>(problem, tiling);
}

GradientRows kokkos_gradients(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                              const RowSet& q_rows, const RowSet& kv_rows, KokkosTiling tiling, KokkosSpace space,
                              bool with_condition, std::int64_t pair_budget) {
  require_runtime(space);
#ifdef KOKKOS_ENABLE_CUDA
  if (space == KokkosSpace::device)
    return algorithm2<Kokkos::Cuda>(problem, inputs, dout, q_rows, kv_rows, tiling, with_condition, pair_budget);
#endif
  return algorithm2<Kokkos::DefaultHostExecutionSpace>(problem, inputs, dout, q_rows, kv_rows, tiling, with_condition,
                                                       pair_budget);
}

GradientRows kokkos_gradient_baseline(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                                      const RowSet& q_rows, const RowSet& kv_rows, DType working, KokkosSpace space,
                                      std::int64_t pair_budget) {
  require_runtime(space);
#ifdef KOKKOS_ENABLE_CUDA
  if (space == KokkosSpace::device)
    return rounded_backward<Kokkos::Cuda>(problem, inputs, dout, q_rows, kv_rows, working, pair_budget);
#endif
  return rounded_backward<Kokkos::DefaultHostExecutionSpace>(problem, inputs, dout, q_rows, kv_rows, working, pair_budget);
}

}  // namespace flashcheck
