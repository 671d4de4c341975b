#include "oracles/kokkos/kokkos_reference.hpp"

#include <Kokkos_Core.hpp>
#include <Kokkos_MathematicalFunctions.hpp>
#include <fmt/format.h>

#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace flashcheck {
namespace {

// Kokkos is initialised once per process, on first use, and finalised at exit.
class KokkosRuntime {
 public:
  static void ensure() {
    static std::once_flag once;
    std::call_once(once, [] {
      if (!Kokkos::is_initialized()) {
        Kokkos::InitArguments arguments;
        arguments.disable_warnings = true;
        Kokkos::initialize(arguments);
        static KokkosRuntime guard;  // destroyed at exit: finalises
      }
    });
  }
  ~KokkosRuntime() {
    if (Kokkos::is_initialized()) Kokkos::finalize();
  }

 private:
  KokkosRuntime() = default;
};

// The masks, read from the Problem spec (this reference's own code): with lq
// queries and lk keys, query i sees key j when this returns true.
struct MaskRule {
  int kind;  // MaskKind as an int (device-copyable)
  std::int64_t left, right;

  KOKKOS_INLINE_FUNCTION bool sees(std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) const {
    const std::int64_t diagonal = i + lk - lq;
    switch (kind) {
      case static_cast<int>(MaskKind::causal_tl): return j <= i;
      case static_cast<int>(MaskKind::causal_br): return j <= diagonal;
      case static_cast<int>(MaskKind::window):
        return (left < 0 || j >= diagonal - left) && (right < 0 || j <= diagonal + right);
      default: return true;
    }
  }
};

// Keys a tile may hold at most (the per-row logit buffer lives in registers or
// local memory on a GPU).
constexpr std::int64_t kMaxKeyTile = 1024;

template <typename Acc>
AttentionRows online_softmax(const Problem& p, const Inputs& in, const RowSet& rows, KokkosTiling tiling) {
  using Space = Kokkos::DefaultExecutionSpace;
  using Team = Kokkos::TeamPolicy<Space>::member_type;
  using Kokkos::Experimental::exp;
  using Kokkos::Experimental::log;

  const std::int64_t batch = p.batch, heads = p.heads_q, heads_kv = p.heads_kv, group = p.group_size();
  const std::int64_t nrows = rows.size(), d = p.head_dim, dv = p.head_dim_v, skv = p.seqlen_kv;
  const std::int64_t key_tile = tiling.key_tile, rows_per_team = tiling.rows_per_team;

  // Inputs on the execution space's memory: the sampled query rows only.
  Kokkos::View<Acc****, Kokkos::LayoutRight, Space> q("q", batch, heads, nrows, d);
  Kokkos::View<Acc****, Kokkos::LayoutRight, Space> k("k", batch, heads_kv, skv, d);
  Kokkos::View<Acc****, Kokkos::LayoutRight, Space> v("v", batch, heads_kv, skv, dv);
  Kokkos::View<Acc****, Kokkos::LayoutRight, Space> o("o", batch, heads, nrows, dv);
  Kokkos::View<Acc***, Kokkos::LayoutRight, Space> lse("lse", batch, heads, nrows);
  Kokkos::View<std::int64_t*, Space> position("position", nrows);
  Kokkos::View<std::int64_t*, Space> len_q("len_q", batch), len_kv("len_kv", batch);
  {
    auto q_host = Kokkos::create_mirror_view(q);
    auto k_host = Kokkos::create_mirror_view(k);
    auto v_host = Kokkos::create_mirror_view(v);
    auto position_host = Kokkos::create_mirror_view(position);
    auto len_q_host = Kokkos::create_mirror_view(len_q);
    auto len_kv_host = Kokkos::create_mirror_view(len_kv);
    for (std::int64_t b = 0; b < batch; ++b) {
      len_q_host(b) = p.len_q(b);
      len_kv_host(b) = p.len_kv(b);
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t r = 0; r < nrows; ++r)
          for (std::int64_t c = 0; c < d; ++c) q_host(b, h, r, c) = static_cast<Acc>(in.q.get(b, h, rows.rows[r], c));
      for (std::int64_t h = 0; h < heads_kv; ++h)
        for (std::int64_t j = 0; j < skv; ++j) {
          for (std::int64_t c = 0; c < d; ++c) k_host(b, h, j, c) = static_cast<Acc>(in.k.get(b, h, j, c));
          for (std::int64_t c = 0; c < dv; ++c) v_host(b, h, j, c) = static_cast<Acc>(in.v.get(b, h, j, c));
        }
    }
    for (std::int64_t r = 0; r < nrows; ++r) position_host(r) = rows.rows[r];
    Kokkos::deep_copy(q, q_host);
    Kokkos::deep_copy(k, k_host);
    Kokkos::deep_copy(v, v_host);
    Kokkos::deep_copy(position, position_host);
    Kokkos::deep_copy(len_q, len_q_host);
    Kokkos::deep_copy(len_kv, len_kv_host);
  }

  const MaskRule mask{static_cast<int>(p.mask), p.window_left, p.window_right};
  const Acc scale = static_cast<Acc>(p.softmax_scale);
  const Acc minus_infinity = -std::numeric_limits<Acc>::infinity();
  const Acc not_a_number = std::numeric_limits<Acc>::quiet_NaN();
  const std::int64_t row_tiles = (nrows + rows_per_team - 1) / rows_per_team;

  // One team per (batch, head, tile of query rows); a thread per query row; the
  // vector lanes of a thread share each dot product.
  Kokkos::parallel_for(
      "flashcheck::kokkos::online_softmax", Kokkos::TeamPolicy<Space>(batch * heads * row_tiles, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        const std::int64_t tile = team.league_rank() % row_tiles;
        const std::int64_t h = (team.league_rank() / row_tiles) % heads;
        const std::int64_t b = team.league_rank() / (row_tiles * heads);
        const std::int64_t hk = h / group;
        const std::int64_t first_row = tile * rows_per_team;
        const std::int64_t last_row = first_row + rows_per_team < nrows ? first_row + rows_per_team : nrows;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, first_row, last_row), [&](const std::int64_t r) {
          const std::int64_t i = position(r), lq = len_q(b), lk = len_kv(b);
          if (i >= lq) return;  // padding: left 0 / -inf
          Acc running_max = minus_infinity, running_sum = 0;
          bool saw_key = false;
          Acc logits[kMaxKeyTile];
          for (std::int64_t j = 0; j < dv; ++j) o(b, h, r, j) = 0;
          for (std::int64_t tile_start = 0; tile_start < lk; tile_start += key_tile) {
            const std::int64_t tile_end = tile_start + key_tile < lk ? tile_start + key_tile : lk;
            // Logits of this tile and their maximum (NaN-propagating).
            Acc tile_max = minus_infinity;
            bool tile_seen = false, tile_nan = false;
            for (std::int64_t j = tile_start; j < tile_end; ++j) {
              if (!mask.sees(i, j, lq, lk)) continue;
              Acc dot = 0;
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, d),
                  [&](const std::int64_t c, Acc& partial) { partial += q(b, h, r, c) * k(b, hk, j, c); }, dot);
              const Acc logit = scale * dot;
              logits[j - tile_start] = logit;
              tile_seen = true;
              if (logit != logit) tile_nan = true;
              else if (logit > tile_max) tile_max = logit;
            }
            if (!tile_seen) continue;  // tile entirely masked: skipped, as kernels do
            if (tile_nan) tile_max = not_a_number;
            const Acc new_max = running_max > tile_max ? running_max : tile_max;
            const Acc grown = tile_nan || running_max != running_max ? not_a_number : new_max;
            // While every logit seen is -inf the maximum is -inf, and exp(-inf - -inf)
            // would be NaN: subtract 0 instead, so such keys weigh exactly 0, as in
            // the plain formula with the row's true maximum (FlashAttention's
            // Check_inf rule). A row whose visible logits are all -inf is NaN below.
            const Acc subtrahend = grown == minus_infinity ? Acc(0) : grown;
            // Rescale what was accumulated under the old maximum.
            const Acc correction = saw_key ? exp(running_max - subtrahend) : Acc(0);
            running_sum *= correction;
            for (std::int64_t c = 0; c < dv; ++c) o(b, h, r, c) *= correction;
            for (std::int64_t j = tile_start; j < tile_end; ++j) {
              if (!mask.sees(i, j, lq, lk)) continue;  // masked keys are absent, never weighted by zero
              const Acc weight = exp(logits[j - tile_start] - subtrahend);
              running_sum += weight;
              for (std::int64_t c = 0; c < dv; ++c) o(b, h, r, c) += weight * v(b, hk, j, c);
            }
            running_max = grown;
            saw_key = true;
          }
          if (!saw_key) {  // fully masked row: O = 0, LSE = -inf
            lse(b, h, r) = minus_infinity;
            return;
          }
          if (running_max == minus_infinity) {  // every visible logit -inf: the plain formula's 0/0
            for (std::int64_t c = 0; c < dv; ++c) o(b, h, r, c) = not_a_number;
            lse(b, h, r) = not_a_number;
            return;
          }
          for (std::int64_t c = 0; c < dv; ++c) o(b, h, r, c) /= running_sum;
          lse(b, h, r) = running_max + log(running_sum);
        });
      });
  Kokkos::fence();

  AttentionRows out(p, rows);
  auto o_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), o);
  auto lse_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), lse);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t r = 0; r < nrows; ++r) {
        if (rows.rows[r] >= p.len_q(b)) continue;
        out.lse[out.index(b, h, r)] = static_cast<double>(lse_host(b, h, r));
        for (std::int64_t c = 0; c < dv; ++c) out.o_row(b, h, r)[c] = static_cast<double>(o_host(b, h, r, c));
      }
  return out;
}

}  // namespace

bool kokkos_available() { return true; }

std::string kokkos_description() {
  return fmt::format("Kokkos {}.{}.{} ({})", KOKKOS_VERSION / 10000, KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100,
                     Kokkos::DefaultExecutionSpace::name());
}

AttentionRows kokkos_reference(const Problem& problem, const Inputs& inputs, const RowSet& rows,
                               Accumulation accumulation, KokkosTiling tiling) {
  if (tiling.key_tile < 1 || tiling.key_tile > kMaxKeyTile || tiling.rows_per_team < 1)
    throw std::invalid_argument(fmt::format("Kokkos tiling: key_tile must be in [1, {}] and rows_per_team >= 1",
                                            kMaxKeyTile));
  KokkosRuntime::ensure();
  return accumulation == Accumulation::f64 ? online_softmax<double>(problem, inputs, rows, tiling)
                                           : online_softmax<float>(problem, inputs, rows, tiling);
}

}  // namespace flashcheck
