// The Kokkos reference's host side: the kernels of kokkos_attention.hpp
// launched on the space asked for, over inputs staged in its memory
// (kokkos_host.hpp: the runtime, the staging and the tiling, shared with the
// gradients of kokkos_backward.cpp), and the results copied back.
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

#include <Kokkos_Core.hpp>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "flashcheck/oracles/kokkos/kokkos_attention.hpp"
#include "kokkos_host.hpp"

namespace flashcheck {
namespace {

namespace ka = kokkos_attention;
using namespace kokkos_host;

template <class Space, class Acc>
AttentionRows online_softmax(const Problem& p, const Inputs& in, const RowSet& rows, KokkosTiling requested) {
  const KokkosTiling tiling = fit<Space, Acc>(p, requested);
  const std::int64_t nrows = rows.size();
  AttentionRows out(p, rows);
  if (nrows == 0 || p.batch == 0) return out;

  const RowGeometry<Space> geometry(p, rows);
  // The rows' positions and the per-sequence lengths, in the space's memory.
  const Kokkos::View<std::int64_t*, Space> position = geometry.position, len_q = geometry.len_q,
                                           len_kv = geometry.len_kv;

  // The Views own the memory until the end of this function; the kernels get
  // DeviceArrays of them (kokkos_attention.hpp says why).
  auto kernel = make_kernel<Space, Acc>(p, nrows, tiling);
  const auto q = stage<Space, Acc>(in.q, "q", position, nrows);
  const auto k = stage_keys<Space, Acc>(p, in, in.k, "k");
  const auto v = stage_keys<Space, Acc>(p, in, in.v, "v");
  kernel.q = ka::device_array<const Acc>(q);
  kernel.k = ka::device_array<const Acc>(k);
  kernel.v = ka::device_array<const Acc>(v);
  Kokkos::View<int*, Space> v_row_finite("v_row_finite", extent(p.batch * p.heads_kv * p.seqlen_kv));
  Kokkos::parallel_for("flashcheck::kokkos::finite_rows", Kokkos::RangePolicy<Space>(0, v_row_finite.size()),
                       MarkFiniteRows<Space, Acc>{kernel.v, ka::device_array<int>(v_row_finite)});
  kernel.v_row_finite = ka::device_array<const int>(v_row_finite);
  kernel.position = ka::device_array<const std::int64_t>(position);
  kernel.len_q = ka::device_array<const std::int64_t>(len_q);
  kernel.len_kv = ka::device_array<const std::int64_t>(len_kv);
  const Kokkos::View<Acc****, Kokkos::LayoutRight, Space> o("o", extent(p.batch), extent(p.heads_q), extent(nrows),
                                                            extent(p.head_dim_v));
  const Kokkos::View<Acc***, Kokkos::LayoutRight, Space> lse("lse", extent(p.batch), extent(p.heads_q), extent(nrows));
  kernel.o = ka::device_array<Acc>(o);
  kernel.lse = ka::device_array<Acc>(lse);

  Kokkos::TeamPolicy<Space> policy(kernel.league_size(), static_cast<int>(tiling.team_size));
  const int team_max = policy.team_size_max(kernel, Kokkos::ParallelForTag());
  if (tiling.team_size > team_max) policy = Kokkos::TeamPolicy<Space>(kernel.league_size(), team_max);
  policy.set_scratch_size(0, Kokkos::PerTeam(kernel.scratch_bytes()));
  Kokkos::parallel_for("flashcheck::kokkos::online_softmax", policy, kernel);
  Kokkos::fence();

  // O and LSE have AttentionRows' own order ([b][h][r][dv], [b][h][r]).
  if constexpr (std::is_same_v<Acc, double>) {
    Kokkos::deep_copy(Kokkos::View<double****, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                          out.o.data(), extent(p.batch), extent(p.heads_q), extent(nrows), extent(p.head_dim_v)),
                      o);
    Kokkos::deep_copy(Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                          out.lse.data(), extent(p.batch), extent(p.heads_q), extent(nrows)),
                      lse);
  } else {
    auto o_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), o);
    auto lse_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lse);
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t r = 0; r < nrows; ++r) {
          out.lse[out.index(b, h, r)] = static_cast<double>(lse_host(b, h, r));
          for (std::int64_t c = 0; c < p.head_dim_v; ++c) out.o_row(b, h, r)[c] = static_cast<double>(o_host(b, h, r, c));
        }
  }
  // Padding rows (past a sequence's valid length) are left 0 / -inf, as AttentionRows has them.
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < nrows; ++r)
        if (rows.rows[r] >= p.len_q(b)) out.lse[out.index(b, h, r)] = -std::numeric_limits<double>::infinity();
  return out;
}

// Every kernel holds DeviceArrays, never a View (kokkos_attention.hpp says why):
// a View is not trivially copyable, so one put back into a kernel fails here,
// in the host-only build (CI) too.
template <class Space>
constexpr bool kernels_hold_no_view =
    std::is_trivially_copyable_v<ka::TiledOnlineSoftmax<Space, double>> &&
    std::is_trivially_copyable_v<ka::TiledOnlineSoftmax<Space, float>> &&
    std::is_trivially_copyable_v<ka::PlainRoundedAttention<Space>> &&
    std::is_trivially_copyable_v<DecodeTensor<Space, double>> && std::is_trivially_copyable_v<DecodeTensor<Space, float>> &&
    std::is_trivially_copyable_v<MarkFiniteRows<Space, double>> &&
    std::is_trivially_copyable_v<MarkFiniteRows<Space, float>> && std::is_trivially_copyable_v<RoundToWorking<Space>>;
static_assert(kernels_hold_no_view<Kokkos::DefaultHostExecutionSpace>, "a Kokkos kernel holds a View");
#ifdef KOKKOS_ENABLE_CUDA
static_assert(kernels_hold_no_view<Kokkos::Cuda>, "a Kokkos kernel holds a View");
#endif

template <class Space>
AttentionRows plain_rounded(const Problem& p, const Inputs& in, const RowSet& rows, DType working) {
  const std::int64_t nrows = rows.size();
  AttentionRows out(p, rows);
  if (nrows == 0 || p.batch == 0) return out;
  const RowGeometry<Space> geometry(p, rows);
  // The rows' positions and the per-sequence lengths, in the space's memory.
  const Kokkos::View<std::int64_t*, Space> position = geometry.position, len_q = geometry.len_q,
                                           len_kv = geometry.len_kv;
  ka::PlainRoundedAttention<Space> kernel;
  kernel.g = {p.batch, p.heads_q, p.heads_kv, p.group_size(), nrows, p.head_dim, p.head_dim_v, p.seqlen_kv};
  kernel.mask = mask_spec(p);
  kernel.modify = score_mod(p);
  kernel.working = storage_code(working);
  kernel.scale = static_cast<float>(p.softmax_scale);
  kernel.minus_infinity = -std::numeric_limits<float>::infinity();
  kernel.not_a_number = std::numeric_limits<float>::quiet_NaN();
  // Inputs in f32 (exact), rounded to the working dtype when it is narrower
  // (fp8 inputs are in their format already: stored value times descale).
  if (ka::is_fp8(kernel.working) && !is_fp8(p.dtype))
    throw std::invalid_argument("Kokkos baseline: an fp8 working dtype takes fp8 inputs");
  const ka::StorageCode inputs_code = kernel.score_code();
  const auto q = stage_rounded<Space>(in.q, "q", position, nrows, inputs_code);
  const auto k = round_staged<Space>(stage_keys<Space, float>(p, in, in.k, "k"), inputs_code);
  const auto v = round_staged<Space>(stage_keys<Space, float>(p, in, in.v, "v"), inputs_code);
  // The Views own the memory until the end of this function; the kernel gets
  // DeviceArrays of them (kokkos_attention.hpp says why).
  kernel.q = ka::device_array<const float>(q);
  kernel.k = ka::device_array<const float>(k);
  kernel.v = ka::device_array<const float>(v);
  kernel.position = ka::device_array<const std::int64_t>(position);
  kernel.len_q = ka::device_array<const std::int64_t>(len_q);
  kernel.len_kv = ka::device_array<const std::int64_t>(len_kv);
  const std::int64_t row_count = p.batch * p.heads_q * nrows;
  const Kokkos::View<float*, Space> accumulator("accumulator", extent(row_count * p.head_dim_v));
  const Kokkos::View<float****, Kokkos::LayoutRight, Space> o("o", extent(p.batch), extent(p.heads_q), extent(nrows),
                                                              extent(p.head_dim_v));
  const Kokkos::View<float***, Kokkos::LayoutRight, Space> lse("lse", extent(p.batch), extent(p.heads_q), extent(nrows));
  kernel.accumulator = ka::device_array<float>(accumulator);
  kernel.o = ka::device_array<float>(o);
  kernel.lse = ka::device_array<float>(lse);
  Kokkos::parallel_for("flashcheck::kokkos::plain_rounded", Kokkos::RangePolicy<Space>(0, row_count), kernel);
  Kokkos::fence();
  auto o_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), o);
  auto lse_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lse);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < nrows; ++r) {
        out.lse[out.index(b, h, r)] = static_cast<double>(lse_host(b, h, r));
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) out.o_row(b, h, r)[c] = static_cast<double>(o_host(b, h, r, c));
      }
  return out;
}

template <class Space>
AttentionRows run_in(const Problem& problem, const Inputs& inputs, const RowSet& rows, Accumulation accumulation,
                     KokkosTiling tiling) {
  return accumulation == Accumulation::f64 ? online_softmax<Space, double>(problem, inputs, rows, tiling)
                                           : online_softmax<Space, float>(problem, inputs, rows, tiling);
}

}  // namespace

bool kokkos_available() {
#ifdef KOKKOS_ENABLE_CUDA
  return gpu_present();  // a CUDA Kokkos does not initialise without a device
#else
  return true;
#endif
}

bool kokkos_device_available() { return gpu_present(); }

std::string kokkos_description() {
  const std::string version = "Kokkos " + text(KOKKOS_VERSION / 10000) + "." + text(KOKKOS_VERSION / 100 % 100) + "." +
                              text(KOKKOS_VERSION % 100);
#ifdef KOKKOS_ENABLE_CUDA
  return version + " (Cuda" + (gpu_present() ? "" : ": no GPU present") + ", host " +
         Kokkos::DefaultHostExecutionSpace::name() + ")";
#else
  return version + " (" + Kokkos::DefaultHostExecutionSpace::name() + ", host only)";
#endif
}

KokkosTiling kokkos_fitted_tiling(const Problem& problem, KokkosTiling tiling, KokkosSpace space) {
  require_runtime(space);
#ifdef KOKKOS_ENABLE_CUDA
  if (space == KokkosSpace::device) return fit<Kokkos::Cuda, double>(problem, tiling);
#endif
  return fit<Kokkos::DefaultHostExecutionSpace, double>(problem, tiling);
}

AttentionRows kokkos_baseline(const Problem& problem, const Inputs& inputs, const RowSet& rows, DType working,
                              KokkosSpace space) {
  require_runtime(space);
#ifdef KOKKOS_ENABLE_CUDA
  if (space == KokkosSpace::device) return plain_rounded<Kokkos::Cuda>(problem, inputs, rows, working);
#endif
  return plain_rounded<Kokkos::DefaultHostExecutionSpace>(problem, inputs, rows, working);
}

AttentionRows kokkos_reference(const Problem& problem, const Inputs& inputs, const RowSet& rows,
                               Accumulation accumulation, KokkosTiling tiling, KokkosSpace space) {
  require_runtime(space);
#ifdef KOKKOS_ENABLE_CUDA
  if (space == KokkosSpace::device) return run_in<Kokkos::Cuda>(problem, inputs, rows, accumulation, tiling);
#endif
  return run_in<Kokkos::DefaultHostExecutionSpace>(problem, inputs, rows, accumulation, tiling);
}

}  // namespace flashcheck
