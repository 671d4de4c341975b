// The Kokkos reference's kernel, templated on the execution space and the
// accumulation type (as kokkos-kernels' tests are): the same source runs on
// Serial (Debian's Kokkos, in CI) and on CUDA (a Kokkos built with
// Kokkos_ENABLE_CUDA; scripts/build-kokkos-cuda). Only Kokkos is included here:
// nothing of kernels/, and the masks are this file's own code.
//
// One team per (batch, head, block of R query rows). The block walks the keys
// in tiles of Kt (the FlashAttention recurrence: a running maximum, the running
// sum and the output rescaled whenever the maximum grows), in four phases per
// tile, each a team-wide loop over work items separated by barriers:
//   1. S = scale Q K^T for the R x Kt block, in register micro-tiles of
//      kMicroRows x kMicroKeys (each thread's tile is strided across the block,
//      so that a warp's lanes read consecutive rows and keys);
//   2. per row: the tile's maximum over visible keys, the new running maximum,
//      the correction exp(old - new);
//   3. P = exp(S - max) for every visible (row, key), 0 for masked ones;
//   4. per row the running sum; O = correction O + P V in register micro-tiles
//      of kMicroRows x kMicroCols, read from and written back to O in the
//      execution space's memory (O does not fit a team's scratch on a GPU:
//      Kokkos caps level-0 scratch at 48 KiB per team).
// S/P and the per-row state live in team scratch; Q, K and V are read from the
// space's memory (L1/L2 on a GPU: each element is reused by every micro-tile of
// its row or key). On Serial a team is one thread that runs every micro-tile
// in turn: the same code, and the same arithmetic per row.
//
// A kernel's inputs and outputs are DeviceArrays (a pointer and its extents),
// never Kokkos Views: nvcc 13 with C++20 lays out a rank-1 View (Kokkos 4.6's
// mdspan, with [[no_unique_address]]) differently in host and device code (40
// against 32 bytes for View<const int*, Cuda>), so a functor holding one,
// built on the host and read on the device, reads every later member at the
// wrong offset (docs/kokkos-cuda.md). Views own the memory on the host side
// (kokkos_reference.cpp); only team scratch, made and used on the device, is
// a View.
#pragma once

#include <Kokkos_Core.hpp>
#if KOKKOS_VERSION < 40000
#include <Kokkos_MathematicalFunctions.hpp>
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace flashcheck::kokkos_attention {

#if KOKKOS_VERSION >= 40000
using Kokkos::exp;
using Kokkos::exp2;
using Kokkos::log;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::exp2;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

/// Whether x is finite (false for NaN and +-Inf), on the host and the device.
KOKKOS_INLINE_FUNCTION bool finite(double x) { return x - x == x - x; }

/// The mask kinds, as this reference numbers them (device-copyable).
enum class MaskCode : int { none, causal_tl, causal_br, window };

/// The mask of a problem: kind and window half-widths (< 0: unbounded).
struct MaskSpec {
  MaskCode kind = MaskCode::none;
  std::int64_t left = -1, right = -1;

  /// With lq queries and lk keys, query i sees the keys [begin, end): for every
  /// mask of the vocabulary the visible keys of a row are one interval.
  KOKKOS_INLINE_FUNCTION void visible_keys(std::int64_t i, std::int64_t lq, std::int64_t lk, std::int64_t& begin,
                                           std::int64_t& end) const {
    const std::int64_t diagonal = i + lk - lq;  // the bottom-right-aligned diagonal
    begin = 0;
    end = lk;
    if (kind == MaskCode::causal_tl) end = i + 1 < lk ? i + 1 : lk;
    if (kind == MaskCode::causal_br) end = diagonal + 1 < lk ? diagonal + 1 : lk;
    if (kind == MaskCode::window) {
      if (left >= 0 && diagonal - left > 0) begin = diagonal - left;
      if (right >= 0 && diagonal + right + 1 < lk) end = diagonal + right + 1;
    }
    if (end < begin) end = begin;
    if (end < 0) begin = end = 0;
  }
};

/// The score modifications of a problem (Problem::softcap, Problem::alibi),
/// this reference's own reading of the convention: with s the scaled logit,
/// s <- C tanh(s / C), then s <- s - slope_h |i + (lk - lq) - j|, slope_h the
/// standard ALiBi slope of query head h of `heads`.
struct ScoreModSpec {
  double softcap = 0;  // 0: none
  bool alibi = false;
  std::int64_t heads = 1;

  KOKKOS_INLINE_FUNCTION bool active() const { return softcap > 0 || alibi; }
  KOKKOS_INLINE_FUNCTION double slope(std::int64_t h) const {
    std::int64_t m = 1;  // the largest power of two <= heads
    while (2 * m <= heads) m *= 2;
    const double exponent = h < m ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(m)
                                  : -4.0 * static_cast<double>(2 * (h - m) + 1) / static_cast<double>(m);
    return exp2(exponent);
  }
  /// |ALiBi's bias| of (i, j) for head h (0 without ALiBi).
  KOKKOS_INLINE_FUNCTION double bias_magnitude(std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t lq,
                                               std::int64_t lk) const {
    if (!alibi) return 0;
    const std::int64_t distance = i + (lk - lq) - j;
    return slope(h) * static_cast<double>(distance < 0 ? -distance : distance);
  }
  template <class T>
  KOKKOS_INLINE_FUNCTION T operator()(T s, std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t lq,
                                      std::int64_t lk) const {
    if (softcap > 0) s = static_cast<T>(softcap) * tanh(s / static_cast<T>(softcap));
    if (alibi) s -= static_cast<T>(bias_magnitude(h, i, j, lq, lk));
    return s;
  }
  /// d(modified)/d(s): 1 - tanh^2(s / C) with a softcap, else 1.
  template <class T>
  KOKKOS_INLINE_FUNCTION T derivative(T s) const {
    if (!(softcap > 0)) return T(1);
    const T t = tanh(s / static_cast<T>(softcap));
    return T(1) - t * t;
  }
};

/// Storage dtypes of the raw inputs, as this reference numbers them.
enum class StorageCode : int { f32, f16, bf16, e4m3, e5m2 };

KOKKOS_INLINE_FUNCTION bool is_fp8(StorageCode code) { return code == StorageCode::e4m3 || code == StorageCode::e5m2; }

/// The exact value of one stored fp8 element (without its tensor's descale),
/// this reference's own decoding: E4M3 (bias 7, no infinities, NaN at
/// S.1111.111) and E5M2 (bias 15, IEEE-style).
KOKKOS_INLINE_FUNCTION double decode_fp8(StorageCode code, std::uint8_t bits) {
  const bool e4m3 = code == StorageCode::e4m3;
  const int fraction_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, top = e4m3 ? 15 : 31;
  const int exponent = (bits & 0x7f) >> fraction_bits;
  const int fraction = bits & ((1 << fraction_bits) - 1);
  const double sign = (bits & 0x80) ? -1.0 : 1.0;
  double magnitude;
  if (e4m3 ? (bits & 0x7f) == 0x7f : exponent == top) {
    const std::uint64_t wide = (std::uint64_t{0x7ff} << 52) | (e4m3 || fraction ? std::uint64_t{1} << 51 : 0);
    std::memcpy(&magnitude, &wide, sizeof magnitude);  // NaN, or E5M2's infinity
  } else {
    // (fraction / 2^f) 2^(1 - bias) below the normal range, (1 + fraction / 2^f) 2^(e - bias) in it: exact.
    const double unit = static_cast<double>(std::int64_t{1} << fraction_bits);
    const int scale = exponent == 0 ? 1 - bias : exponent - bias;
    double power = 1;
    for (int n = 0; n < (scale < 0 ? -scale : scale); ++n) power *= 2;
    power = scale < 0 ? 1 / power : power;
    magnitude = (exponent == 0 ? fraction / unit : 1 + fraction / unit) * power;
  }
  return sign * magnitude;
}

/// The exact value of one stored element (f16 and bf16 from their bits).
KOKKOS_INLINE_FUNCTION double decode_half(StorageCode code, std::uint16_t bits) {
  if (code == StorageCode::bf16) {  // the upper half of an f32
    const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, sizeof value);
    return static_cast<double>(value);
  }
  const bool negative = (bits >> 15) != 0;
  const int exponent = (bits >> 10) & 0x1f;
  const std::uint64_t mantissa = bits & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {  // Inf or NaN: the same class in f64
    const std::uint64_t wide = (std::uint64_t{0x7ff} << 52) | (mantissa << 42);
    std::memcpy(&magnitude, &wide, sizeof magnitude);
  } else if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact
    magnitude = static_cast<double>(mantissa) * 5.9604644775390625e-08;
  } else {  // normal: rebias the exponent, widen the mantissa
    const std::uint64_t wide = (static_cast<std::uint64_t>(exponent - 15 + 1023) << 52) | (mantissa << 42);
    std::memcpy(&magnitude, &wide, sizeof magnitude);
  }
  return negative ? -magnitude : magnitude;
}

/// The geometry a team needs, device-copyable.
struct Geometry {
  std::int64_t batch = 0, heads = 0, heads_kv = 0, group = 1;
  std::int64_t rows = 0;  // query rows computed per (batch, head)
  std::int64_t head_dim = 0, head_dim_v = 0, seqlen_kv = 0;
};

/// A row-major array in an execution space's memory, as a kernel receives it:
/// its pointer and extents, plain data with one layout in host and device
/// code (see the top of this file). The View that owns the memory outlives
/// every kernel that reads it.
template <class T, int Rank>
struct DeviceArray {
  static_assert(Rank >= 1 && Rank <= 4, "DeviceArray: rank 1 to 4");
  T* data = nullptr;
  std::int64_t extents[Rank] = {};

  KOKKOS_INLINE_FUNCTION std::int64_t extent(int dimension) const { return extents[dimension]; }
  KOKKOS_INLINE_FUNCTION std::int64_t size() const {
    std::int64_t n = 1;
    for (int r = 0; r < Rank; ++r) n *= extents[r];
    return n;
  }
  KOKKOS_INLINE_FUNCTION T& operator()(std::int64_t i) const { return data[i]; }
  KOKKOS_INLINE_FUNCTION T& operator()(std::int64_t i, std::int64_t j) const { return data[i * extents[1] + j]; }
  KOKKOS_INLINE_FUNCTION T& operator()(std::int64_t i, std::int64_t j, std::int64_t k) const {
    return data[(i * extents[1] + j) * extents[2] + k];
  }
  KOKKOS_INLINE_FUNCTION T& operator()(std::int64_t i, std::int64_t j, std::int64_t k, std::int64_t l) const {
    return data[((i * extents[1] + j) * extents[2] + k) * extents[3] + l];
  }
};

/// The DeviceArray of a contiguous LayoutRight (or rank-1) View; an empty View
/// gives a null pointer and zero extents.
template <class T, class View>
DeviceArray<T, static_cast<int>(View::rank)> device_array(const View& view) {
  static_assert(std::is_same_v<typename View::array_layout, Kokkos::LayoutRight> || View::rank == 1,
                "device_array: a row-major View");
  DeviceArray<T, static_cast<int>(View::rank)> array;
  array.data = view.data();
  for (int r = 0; r < static_cast<int>(View::rank); ++r) array.extents[r] = static_cast<std::int64_t>(view.extent(r));
  return array;
}

template <class Space, class Acc>
struct TiledOnlineSoftmax {
  using Policy = Kokkos::TeamPolicy<Space>;
  using Team = typename Policy::member_type;
  using ScratchSpace = typename Space::scratch_memory_space;
  template <class T>
  using ScratchArray = Kokkos::View<T*, ScratchSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using Tensor = DeviceArray<Acc, 4>;
  using ConstTensor = DeviceArray<const Acc, 4>;

  // Register micro-tiles: S as rows x keys, O as rows x columns.
  static constexpr std::int64_t kMicroRows = 4, kMicroKeys = 4, kMicroCols = 8;

  ConstTensor q;  // [batch][heads][rows][d]: the computed rows only
  ConstTensor k, v;  // [batch][heads_kv][seqlen_kv][d or dv]
  DeviceArray<const int, 1> v_row_finite;  // [(batch heads_kv + hk) seqlen_kv + j]: V row j all finite
  Tensor o;  // [batch][heads][rows][dv]
  DeviceArray<Acc, 3> lse;  // [batch][heads][rows]
  DeviceArray<const std::int64_t, 1> position;  // row -> query position
  DeviceArray<const std::int64_t, 1> len_q, len_kv;  // per batch
  Geometry g;
  MaskSpec mask;
  ScoreModSpec modify;
  Acc scale = 1;
  Acc minus_infinity = 0, not_a_number = 0;  // set on the host (std::numeric_limits)
  std::int64_t rows_per_team = 64, key_tile = 32;

  // Derived in prepare().
  std::int64_t row_tiles = 0, row_groups = 0, key_groups = 0, col_groups = 0;
  std::int64_t rows_padded = 0, keys_padded = 0, s_stride = 0;

  void prepare() {
    row_tiles = (g.rows + rows_per_team - 1) / rows_per_team;
    row_groups = (rows_per_team + kMicroRows - 1) / kMicroRows;
    key_groups = (key_tile + kMicroKeys - 1) / kMicroKeys;
    col_groups = (g.head_dim_v + kMicroCols - 1) / kMicroCols;
    rows_padded = row_groups * kMicroRows;
    keys_padded = key_groups * kMicroKeys;
    s_stride = keys_padded | 1;  // odd: the rows of a micro-tile fall in different banks
  }

  std::int64_t league_size() const { return g.batch * g.heads * row_tiles; }

  /// Team scratch: S/P and the per-row state.
  std::size_t scratch_bytes() const {
    const auto n = static_cast<std::size_t>(rows_padded);
    return ScratchArray<Acc>::shmem_size(n * static_cast<std::size_t>(s_stride)) +
           4 * ScratchArray<Acc>::shmem_size(n) + 4 * ScratchArray<std::int64_t>::shmem_size(n);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Team& team) const {
    const std::int64_t block = team.league_rank() % row_tiles;
    const std::int64_t h = (team.league_rank() / row_tiles) % g.heads;
    const std::int64_t b = team.league_rank() / (row_tiles * g.heads);
    const std::int64_t hk = h / g.group;
    const std::int64_t first_row = block * rows_per_team;
    const std::int64_t rows_here = first_row + rows_per_team < g.rows ? rows_per_team : g.rows - first_row;
    const std::int64_t lq = len_q(b), lk = len_kv(b);

    const auto n = static_cast<std::size_t>(rows_padded);
    ScratchArray<Acc> s(team.team_scratch(0), n * static_cast<std::size_t>(s_stride));
    ScratchArray<Acc> row_max(team.team_scratch(0), n), row_sum(team.team_scratch(0), n),
        row_correction(team.team_scratch(0), n), row_subtrahend(team.team_scratch(0), n);
    ScratchArray<std::int64_t> key_begin(team.team_scratch(0), n), key_end(team.team_scratch(0), n),
        saw_key(team.team_scratch(0), n), seen_now(team.team_scratch(0), n);

    // Per row: its visible keys (none for padding rows and the block's own
    // padding), the running state, and O = 0.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_padded), [&](const std::int64_t r) {
      std::int64_t begin = 0, end = 0;
      if (r < rows_here) {
        const std::int64_t i = position(first_row + r);
        if (i < lq) mask.visible_keys(i, lq, lk, begin, end);
      }
      key_begin(r) = begin;
      key_end(r) = end;
      row_max(r) = minus_infinity;
      row_sum(r) = 0;
      saw_key(r) = 0;
      seen_now(r) = 0;
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_here * g.head_dim_v), [&](const std::int64_t e) {
      o(b, h, first_row + e / g.head_dim_v, e % g.head_dim_v) = 0;
    });
    team.team_barrier();

    // The keys any row of the block sees; tiles start at multiples of Kt from
    // key 0, as a kernel's do.
    std::int64_t lowest = lk, highest = 0;
    for (std::int64_t r = 0; r < rows_padded; ++r)
      if (key_end(r) > key_begin(r)) {
        lowest = key_begin(r) < lowest ? key_begin(r) : lowest;
        highest = key_end(r) > highest ? key_end(r) : highest;
      }

    for (std::int64_t tile_start = lowest / key_tile * key_tile; tile_start < highest; tile_start += key_tile) {
      const std::int64_t tile_end = tile_start + key_tile < lk ? tile_start + key_tile : lk;

      // 1. Logits of the block. Rows and keys past the block's end read a valid
      //    row (their logits are never used), so the inner loop has no branch.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, row_groups * key_groups), [&](const std::int64_t item) {
        const std::int64_t row_group = item / key_groups, key_group = item % key_groups;
        const Acc* q_row[kMicroRows];
        const Acc* k_row[kMicroKeys];
        for (std::int64_t a = 0; a < kMicroRows; ++a) {
          const std::int64_t r = row_group + a * row_groups;
          q_row[a] = &q(b, h, first_row + (r < rows_here ? r : rows_here - 1), 0);
        }
        for (std::int64_t e = 0; e < kMicroKeys; ++e) {
          const std::int64_t j = tile_start + key_group + e * key_groups;
          k_row[e] = &k(b, hk, j < tile_end ? j : tile_end - 1, 0);
        }
        Acc dot[kMicroRows][kMicroKeys] = {};
        for (std::int64_t c = 0; c < g.head_dim; ++c) {
          Acc q_value[kMicroRows], k_value[kMicroKeys];
          for (std::int64_t a = 0; a < kMicroRows; ++a) q_value[a] = q_row[a][c];
          for (std::int64_t e = 0; e < kMicroKeys; ++e) k_value[e] = k_row[e][c];
          for (std::int64_t a = 0; a < kMicroRows; ++a)
            for (std::int64_t e = 0; e < kMicroKeys; ++e) dot[a][e] += q_value[a] * k_value[e];
        }
        for (std::int64_t a = 0; a < kMicroRows; ++a)
          for (std::int64_t e = 0; e < kMicroKeys; ++e) {
            Acc logit = scale * dot[a][e];
            if (modify.active()) {  // softcap, ALiBi (rows and keys past the end: computed, never used)
              const std::int64_t r = row_group + a * row_groups;
              const std::int64_t i = position(first_row + (r < rows_here ? r : rows_here - 1));
              logit = modify(logit, h, i, tile_start + key_group + e * key_groups, lq, lk);
            }
            s((row_group + a * row_groups) * s_stride + key_group + e * key_groups) = logit;
          }
      });
      team.team_barrier();

      // 2. Per row: the tile's maximum (NaN-propagating) and the new running state.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_padded), [&](const std::int64_t r) {
        const std::int64_t first = key_begin(r) > tile_start ? key_begin(r) : tile_start;
        const std::int64_t last = key_end(r) < tile_end ? key_end(r) : tile_end;
        if (first >= last) {  // no visible key here: the row skips this tile, as kernels do
          seen_now(r) = 0;
          row_correction(r) = 1;
          return;
        }
        Acc tile_max = minus_infinity;
        bool tile_nan = false;
        for (std::int64_t j = first; j < last; ++j) {
          const Acc logit = s(r * s_stride + j - tile_start);
          if (logit != logit) tile_nan = true;
          else if (logit > tile_max) tile_max = logit;
        }
        if (tile_nan) tile_max = not_a_number;
        const Acc running_max = row_max(r);
        const Acc new_max = running_max > tile_max ? running_max : tile_max;
        const Acc grown = tile_nan || running_max != running_max ? not_a_number : new_max;
        // While every logit seen is -inf the maximum is -inf, and exp(-inf - -inf)
        // would be NaN: subtract 0 instead, so such keys weigh exactly 0, as in
        // the plain formula with the row's true maximum (FlashAttention's
        // Check_inf rule). A row whose visible logits are all -inf is NaN at the end.
        const Acc subtrahend = grown == minus_infinity ? Acc(0) : grown;
        row_correction(r) = saw_key(r) ? exp(running_max - subtrahend) : Acc(0);
        row_subtrahend(r) = subtrahend;
        row_max(r) = grown;
        saw_key(r) = 1;
        seen_now(r) = 1;
      });
      team.team_barrier();

      // 3. Weights: masked keys (and the tile's padding) weigh exactly 0.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_padded * keys_padded), [&](const std::int64_t item) {
        const std::int64_t r = item / keys_padded, j = tile_start + item % keys_padded;
        Acc& entry = s(r * s_stride + item % keys_padded);
        const bool visible = seen_now(r) && j >= key_begin(r) && j < key_end(r) && j < tile_end;
        entry = visible ? exp(entry - row_subtrahend(r)) : Acc(0);
      });
      team.team_barrier();

      // 4a. Per row: sum = correction sum + the weights, in key order.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_padded), [&](const std::int64_t r) {
        if (!seen_now(r)) return;
        Acc sum = row_sum(r) * row_correction(r);
        for (std::int64_t j = 0; j < keys_padded; ++j) sum += s(r * s_stride + j);
        row_sum(r) = sum;
      });
      // 4b. O = correction O + P V. A masked key must be absent, never weighted
      //     by zero (0 * Inf is NaN): where every V row of the tile is finite,
      //     its zero weight adds nothing and the loop runs without a branch;
      //     otherwise masked keys are skipped one by one.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, row_groups * col_groups), [&](const std::int64_t item) {
        const std::int64_t row_group = item / col_groups, col_group = item % col_groups;
        bool active[kMicroRows];
        bool any_active = false;
        for (std::int64_t a = 0; a < kMicroRows; ++a) {
          const std::int64_t r = row_group + a * row_groups;
          active[a] = r < rows_here && seen_now(r);
          any_active = any_active || active[a];
        }
        if (!any_active) return;
        std::int64_t column[kMicroCols];
        for (std::int64_t e = 0; e < kMicroCols; ++e) {
          const std::int64_t c = col_group + e * col_groups;
          column[e] = c < g.head_dim_v ? c : g.head_dim_v - 1;  // past the end: computed, never stored
        }
        Acc accumulator[kMicroRows][kMicroCols];
        for (std::int64_t a = 0; a < kMicroRows; ++a) {
          const std::int64_t r = row_group + a * row_groups;
          const Acc correction = active[a] ? row_correction(r) : Acc(0);
          for (std::int64_t e = 0; e < kMicroCols; ++e)
            accumulator[a][e] = active[a] ? o(b, h, first_row + r, column[e]) * correction : Acc(0);
        }
        bool finite_tile = true;
        for (std::int64_t j = tile_start; j < tile_end; ++j)
          finite_tile = finite_tile && v_row_finite((b * g.heads_kv + hk) * g.seqlen_kv + j) != 0;
        for (std::int64_t j = tile_start; j < tile_end; ++j) {
          Acc weight[kMicroRows], value[kMicroCols];
          for (std::int64_t a = 0; a < kMicroRows; ++a) weight[a] = s((row_group + a * row_groups) * s_stride + j - tile_start);
          for (std::int64_t e = 0; e < kMicroCols; ++e) value[e] = v(b, hk, j, column[e]);
          if (finite_tile) {
            for (std::int64_t a = 0; a < kMicroRows; ++a)
              for (std::int64_t e = 0; e < kMicroCols; ++e) accumulator[a][e] += weight[a] * value[e];
          } else {
            for (std::int64_t a = 0; a < kMicroRows; ++a) {
              const std::int64_t r = row_group + a * row_groups;
              if (!active[a] || j < key_begin(r) || j >= key_end(r)) continue;
              for (std::int64_t e = 0; e < kMicroCols; ++e) accumulator[a][e] += weight[a] * value[e];
            }
          }
        }
        for (std::int64_t a = 0; a < kMicroRows; ++a) {
          if (!active[a]) continue;
          const std::int64_t r = row_group + a * row_groups;
          for (std::int64_t e = 0; e < kMicroCols; ++e)
            if (col_group + e * col_groups < g.head_dim_v) o(b, h, first_row + r, column[e]) = accumulator[a][e];
        }
      });
      team.team_barrier();
    }

    // The end of each row: O / sum and LSE; a fully masked row is O = 0, LSE = -inf;
    // a row whose visible logits are all -inf is the plain formula's 0/0 (NaN);
    // padding rows are -inf (their O stays 0).
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_here), [&](const std::int64_t r) {
      const bool padding = position(first_row + r) >= lq;
      if (padding || !saw_key(r)) lse(b, h, first_row + r) = minus_infinity;
      else if (row_max(r) == minus_infinity) lse(b, h, first_row + r) = not_a_number;
      else lse(b, h, first_row + r) = row_max(r) + log(row_sum(r));
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_here * g.head_dim_v), [&](const std::int64_t e) {
      const std::int64_t r = e / g.head_dim_v, c = e % g.head_dim_v;
      if (!saw_key(r)) return;
      Acc& out = o(b, h, first_row + r, c);
      out = row_max(r) == minus_infinity ? not_a_number : out / row_sum(r);
    });
  }
};

}  // namespace flashcheck::kokkos_attention

namespace flashcheck::kokkos_attention {

// ---- The same-precision baseline: plain attention rounded after each step --
//
// The arithmetic of cpu_lowp (oracles/cpu_lowp.hpp), written again for Kokkos:
// S = round(scale * Q K^T) with each dot product summed in f32 in textbook
// order (one rounding per product and per addition, never fused), softmax in
// f32, P = round(softmax), O = round(P V) summed in f32 in key order, LSE =
// max + log(sum) in f32. One thread per query row; the row's logits are
// recomputed in each of the three passes (maximum, sum, output) instead of
// being stored. On Serial it is cpu_lowp's arithmetic operation for operation;
// on CUDA, expf and logf are CUDA's (within 2 ULP of glibc's), the rest is the
// same IEEE arithmetic.

/// Products, sums and quotients rounded once each, never contracted into FMAs.
KOKKOS_INLINE_FUNCTION float multiply_rounded(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;  // host: ISO C++ mode, -ffp-contract=off
#endif
}
KOKKOS_INLINE_FUNCTION float add_rounded(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KOKKOS_INLINE_FUNCTION float divide_rounded(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// x rounded to an fp8 format, to nearest even, saturating at its largest
/// finite value as cvt.rn.satfinite does (this reference's own code).
KOKKOS_INLINE_FUNCTION float round_fp8(StorageCode code, float x) {
  if (x != x) return x;
  const bool e4m3 = code == StorageCode::e4m3;
  const float magnitude = x < 0 ? -x : x, sign = x < 0 ? -1.0f : 1.0f;
  const float largest = e4m3 ? 448.0f : 57344.0f;
  const float smallest_normal = e4m3 ? 0.015625f : 6.103515625e-05f;  // 2^-6, 2^-14
  float rounded;
  if (magnitude < smallest_normal) {
    // Subnormals are multiples of 2^-9 (E4M3) or 2^-16 (E5M2): adding 2^14 or
    // 2^7, whose f32 spacing that is, rounds to one, exactly.
    const float shift = e4m3 ? 16384.0f : 128.0f;
    rounded = add_rounded(add_rounded(magnitude, shift), -shift);
  } else {
    std::uint32_t m;
    std::memcpy(&m, &magnitude, sizeof m);
    const int dropped = e4m3 ? 20 : 21;  // 23 -> 3 or 2 fraction bits, ties to even
    m += ((1u << (dropped - 1)) - 1) + ((m >> dropped) & 1u);
    m &= ~((1u << dropped) - 1);
    std::memcpy(&rounded, &m, sizeof rounded);
  }
  return sign * (rounded > largest ? largest : rounded);
}

/// x rounded to the working dtype (round to nearest even; f32: unchanged).
KOKKOS_INLINE_FUNCTION float round_working(StorageCode working, float x) {
  if (working == StorageCode::f32 || x != x) return x;
  if (is_fp8(working)) return round_fp8(working, x);
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if (working == StorageCode::bf16) {
    bits += 0x7fffu + ((bits >> 16) & 1u);
    bits &= 0xffff0000u;
    std::memcpy(&x, &bits, sizeof x);
    return x;
  }
  // f16
  const float magnitude = x < 0 ? -x : x;
  const float sign = x < 0 ? -1.0f : 1.0f;
  if (magnitude >= 65520.0f) {  // at or past the halfway point to 2^16: Inf
    const std::uint32_t infinity_bits = 0x7f800000u;
    float infinity;
    std::memcpy(&infinity, &infinity_bits, sizeof infinity);
    return sign * infinity;
  }
  if (magnitude < 6.103515625e-05f)  // f16 subnormals: multiples of 2^-24; 0.5 + x rounds x to one, exactly
    return sign * add_rounded(add_rounded(magnitude, 0.5f), -0.5f);
  std::uint32_t m;
  std::memcpy(&m, &magnitude, sizeof m);
  m += 0xfffu + ((m >> 13) & 1u);  // 23 -> 10 mantissa bits, ties to even (a carry moves the exponent)
  m &= ~0x1fffu;
  float rounded;
  std::memcpy(&rounded, &m, sizeof rounded);
  return sign * rounded;
}

/// The score modifications as the same-precision baselines apply them
/// (cpu_lowp's steps): f32 arithmetic, each step rounded to the working dtype,
/// the ALiBi slope in f32. `t` receives tanh(s / C) (rounded) where there is a
/// softcap.
KOKKOS_INLINE_FUNCTION float modified_rounded(const ScoreModSpec& modify, StorageCode working, float s, std::int64_t h,
                                              std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk,
                                              float* t = nullptr) {
  if (modify.softcap > 0) {
    const auto softcap = static_cast<float>(modify.softcap);
    const float tanh_value = round_working(working, tanh(round_working(working, divide_rounded(s, softcap))));
    if (t) *t = tanh_value;
    s = round_working(working, multiply_rounded(softcap, tanh_value));
  }
  if (modify.alibi) {
    const auto slope = static_cast<float>(modify.slope(h));
    const std::int64_t distance = i + (lk - lq) - j;
    const auto magnitude = static_cast<float>(distance < 0 ? -distance : distance);
    s = round_working(working, add_rounded(s, -round_working(working, multiply_rounded(slope, magnitude))));
  }
  return s;
}

template <class Space>
struct PlainRoundedAttention {
  using Tensor = DeviceArray<const float, 4>;
  Tensor q, k, v;  // rounded to the working dtype already; q holds the computed rows
  DeviceArray<float, 4> o;
  DeviceArray<float, 3> lse;
  DeviceArray<const std::int64_t, 1> position, len_q, len_kv;
  DeviceArray<float, 1> accumulator;  // [row][dv]: each row's f32 sums of P V
  Geometry g;
  MaskSpec mask;
  ScoreModSpec modify;
  StorageCode working = StorageCode::f32;
  float scale = 1, minus_infinity = 0, not_a_number = 0;

  // fp8 (cpu_lowp's fp8 steps): the scores stay in f32, P = exp(S - max) is
  // rounded to the format unnormalized, O = (P V) / l rounded to bf16.
  KOKKOS_INLINE_FUNCTION StorageCode score_code() const { return is_fp8(working) ? StorageCode::f32 : working; }
  KOKKOS_INLINE_FUNCTION StorageCode output_code() const { return is_fp8(working) ? StorageCode::bf16 : working; }

  KOKKOS_INLINE_FUNCTION float logit(std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t r,
                                     std::int64_t j) const {
    float dot = 0;
    for (std::int64_t c = 0; c < g.head_dim; ++c) dot = add_rounded(dot, multiply_rounded(q(b, h, r, c), k(b, hk, j, c)));
    const float scaled = round_working(score_code(), multiply_rounded(dot, scale));
    if (!modify.active()) return scaled;
    const std::int64_t i = position(r), lq = len_q(b), lk = len_kv(b);
    return modified_rounded(modify, score_code(), scaled, h, i, j, lq, lk);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t r = index % g.rows, h = index / g.rows % g.heads, b = index / (g.rows * g.heads);
    const std::int64_t hk = h / g.group, i = position(r), lq = len_q(b), lk = len_kv(b);
    lse(b, h, r) = minus_infinity;  // padding and fully masked rows: O = 0, LSE = -inf
    for (std::int64_t c = 0; c < g.head_dim_v; ++c) o(b, h, r, c) = 0;
    if (i >= lq || lk == 0) return;
    std::int64_t begin = 0, end = 0;
    mask.visible_keys(i, lq, lk, begin, end);
    if (begin == end) return;
    float maximum = minus_infinity;
    bool saw_nan = false;
    for (std::int64_t j = begin; j < end; ++j) {
      const float s = logit(b, h, hk, r, j);
      saw_nan = saw_nan || s != s;
      maximum = maximum < s ? s : maximum;
    }
    if (saw_nan) maximum = not_a_number;
    float sum = 0;
    for (std::int64_t j = begin; j < end; ++j) sum = add_rounded(sum, exp(add_rounded(logit(b, h, hk, r, j), -maximum)));
    lse(b, h, r) = add_rounded(maximum, log(sum));
    float* row = &accumulator(index * g.head_dim_v);
    for (std::int64_t c = 0; c < g.head_dim_v; ++c) row[c] = 0;
    for (std::int64_t j = begin; j < end; ++j) {
      const float p = exp(add_rounded(logit(b, h, hk, r, j), -maximum));
      const float weight = round_working(working, is_fp8(working) ? p : divide_rounded(p, sum));
      for (std::int64_t c = 0; c < g.head_dim_v; ++c) row[c] = add_rounded(row[c], multiply_rounded(weight, v(b, hk, j, c)));
    }
    for (std::int64_t c = 0; c < g.head_dim_v; ++c)
      o(b, h, r, c) = round_working(output_code(), is_fp8(working) ? divide_rounded(row[c], sum) : row[c]);
  }
};

}  // namespace flashcheck::kokkos_attention
