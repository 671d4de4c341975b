// The Kokkos gradient reference's kernels (FlashAttention-2's Algorithm 2 in
// f64), templated on the execution space as the forward's are
// (kokkos_attention.hpp): the same source runs on Serial and on CUDA. A
// private header of oracles/kokkos; only Kokkos and kokkos_attention.hpp (its
// DeviceArray, MaskSpec) are included, nothing of cpu_f64 or kernels/.
//
// Two kernels, each a team per block, each block a loop over tiles in four
// team-wide phases separated by barriers, on a rows x keys tile in team
// scratch (query rows down, key rows across):
//   A. S = Q K^T and dP = dO V^T for the tile, in register micro-tiles of
//      kMicroRows x kMicroKeys (each thread's tile strided across the block,
//      so that a warp's lanes read consecutive rows and keys);
//   B. per (row, key): P = exp(scale S - LSE_row) and dS = P (dP - D_row)
//      where the key is visible to the row, P = dS = 0 where it is not;
//   C. the products into the block's gradient rows, read from and written
//      back to the space's memory in register micro-tiles (they do not fit a
//      team's 48 KiB of scratch next to the tile):
//      KeyBlockGradients  (a team per batch, K/V head, Bc key rows; query rows
//                          of every head of the group in tiles of Br):
//                          dV += P^T dO, dK += dS^T Q;
//      QueryBlockGradient (a team per batch, query head, Br query rows; keys
//                          in tiles of Bc): dQ += dS K.
//      Each output row belongs to one team and each element to one work item,
//      so every sum runs in a fixed order (heads of the group, then tiles,
//      then rows or keys within a tile): deterministic, no atomics. The scale
//      of dQ and dK multiplies the finished sums.
// A masked (row, key) pair must be absent, never weighted by zero (0 * Inf is
// NaN): where the rows (keys) a phase C loop reads are finite, a zero weight
// adds nothing and the loop runs without a branch; a non-finite row (key) is
// skipped where it is not visible.
#pragma once

#include "flashcheck/oracles/kokkos/kokkos_attention.hpp"

namespace flashcheck::kokkos_attention {

/// Shapes of the gradient kernels' operands, device-copyable.
struct GradientGeometry {
  std::int64_t batch = 0, heads = 0, heads_kv = 0, group = 1;
  std::int64_t seqlen_q = 0, seqlen_kv = 0, head_dim = 0, head_dim_v = 0;
};

/// What both gradient kernels read: the inputs decoded to f64, the forward's
/// LSE, D = rowsum(dO o O), per-row finiteness, and the sequence lengths.
struct GradientOperands {
  DeviceArray<const double, 4> q, dout;  // [batch][heads][seqlen_q][d or dv]
  DeviceArray<const double, 4> k, v;     // [batch][heads_kv][seqlen_kv][d or dv]
  DeviceArray<const double, 3> lse, delta;  // [batch][heads][seqlen_q]
  DeviceArray<const int, 1> q_finite, dout_finite;  // [(batch heads + h) seqlen_q + i]: the row all finite
  DeviceArray<const int, 1> k_finite, v_finite;     // [(batch heads_kv + hk) seqlen_kv + j]
  DeviceArray<const std::int64_t, 1> len_q, len_kv;  // per batch
  GradientGeometry g;
  MaskSpec mask;
  ScoreModSpec modify;
  double scale = 1;
};

/// D_i = rowsum(dO_i o O_i), one thread per (batch, head, query row).
template <class Space>
struct RowDelta {
  DeviceArray<const double, 4> dout, o;  // [batch][heads][seqlen_q][dv]
  DeviceArray<double, 3> delta;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t dv = o.extent(3);
    const double* dout_row = &dout.data[index * dv];
    const double* o_row = &o.data[index * dv];
    double sum = 0;
    for (std::int64_t c = 0; c < dv; ++c) sum += dout_row[c] * o_row[c];
    delta.data[index] = sum;
  }
};

/// The tile machinery both kernels share: the scratch layout and phases A, B.
template <class Space>
struct GradientTiles {
  using Policy = Kokkos::TeamPolicy<Space>;
  using Team = typename Policy::member_type;
  using ScratchSpace = typename Space::scratch_memory_space;
  template <class T>
  using ScratchArray = Kokkos::View<T*, ScratchSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  static constexpr std::int64_t kMicroRows = 4, kMicroKeys = 4, kMicroCols = 8;
  // Bits of a row's and a key's flags.
  static constexpr int kQFinite = 1, kDoutFinite = 2, kKeyValid = 1, kKFinite = 2, kVFinite = 4;

  GradientOperands in;
  std::int64_t tile_rows = 64, tile_keys = 32;  // Br, Bc

  // Derived in prepare().
  std::int64_t row_groups = 0, key_groups = 0, rows_padded = 0, keys_padded = 0, s_stride = 0;

  void prepare_tiles() {
    row_groups = (tile_rows + kMicroRows - 1) / kMicroRows;
    key_groups = (tile_keys + kMicroKeys - 1) / kMicroKeys;
    rows_padded = row_groups * kMicroRows;
    keys_padded = key_groups * kMicroKeys;
    s_stride = keys_padded | 1;  // odd: the rows of a micro-tile fall in different banks
  }

  std::size_t scratch_bytes() const {
    const auto rows = static_cast<std::size_t>(rows_padded), keys = static_cast<std::size_t>(keys_padded);
    return 2 * ScratchArray<double>::shmem_size(rows * static_cast<std::size_t>(s_stride)) +
           2 * ScratchArray<double>::shmem_size(rows) + 3 * ScratchArray<std::int64_t>::shmem_size(rows) +
           ScratchArray<int>::shmem_size(rows) + ScratchArray<std::int64_t>::shmem_size(keys) +
           ScratchArray<int>::shmem_size(keys);
  }

  /// One team's tile in scratch. Rows: the query position each tile row reads
  /// (clamped to a valid row where the tile has none: computed, never used),
  /// its visible keys [begin, end) (empty for padding and fully masked rows),
  /// LSE, D and finiteness. Keys: the key position each column reads (clamped
  /// likewise) and its flags.
  struct Tile {
    ScratchArray<double> p, ds, row_lse, row_delta;
    ScratchArray<std::int64_t> row_position, key_begin, key_end, key_position;
    ScratchArray<int> row_flags, key_flags;
  };

  KOKKOS_INLINE_FUNCTION Tile make_tile(const Team& team) const {
    const auto rows = static_cast<std::size_t>(rows_padded), keys = static_cast<std::size_t>(keys_padded);
    Tile t;
    t.p = ScratchArray<double>(team.team_scratch(0), rows * static_cast<std::size_t>(s_stride));
    t.ds = ScratchArray<double>(team.team_scratch(0), rows * static_cast<std::size_t>(s_stride));
    t.row_lse = ScratchArray<double>(team.team_scratch(0), rows);
    t.row_delta = ScratchArray<double>(team.team_scratch(0), rows);
    t.row_position = ScratchArray<std::int64_t>(team.team_scratch(0), rows);
    t.key_begin = ScratchArray<std::int64_t>(team.team_scratch(0), rows);
    t.key_end = ScratchArray<std::int64_t>(team.team_scratch(0), rows);
    t.row_flags = ScratchArray<int>(team.team_scratch(0), rows);
    t.key_position = ScratchArray<std::int64_t>(team.team_scratch(0), keys);
    t.key_flags = ScratchArray<int>(team.team_scratch(0), keys);
    return t;
  }

  /// Sets tile row r to query position i of head h (valid: a row of the
  /// tile within the sequence's length), or to `fallback` with no visible key.
  KOKKOS_INLINE_FUNCTION void set_row(const Tile& t, std::int64_t r, bool valid, std::int64_t i, std::int64_t fallback,
                                      std::int64_t b, std::int64_t h, std::int64_t lq, std::int64_t lk) const {
    std::int64_t begin = 0, end = 0;
    if (valid) in.mask.visible_keys(i, lq, lk, begin, end);
    const std::int64_t at = valid ? i : fallback;
    const std::int64_t flat = (b * in.g.heads + h) * in.g.seqlen_q + at;
    t.row_position(r) = at;
    t.key_begin(r) = begin;
    t.key_end(r) = end;
    t.row_lse(r) = in.lse(b, h, at);
    t.row_delta(r) = in.delta(b, h, at);
    t.row_flags(r) = (in.q_finite(flat) ? kQFinite : 0) | (in.dout_finite(flat) ? kDoutFinite : 0);
  }

  /// Sets tile key e to key position j of K/V head hk, or to `fallback`
  /// (not a key of the tile).
  KOKKOS_INLINE_FUNCTION void set_key(const Tile& t, std::int64_t e, bool valid, std::int64_t j, std::int64_t fallback,
                                      std::int64_t b, std::int64_t hk) const {
    const std::int64_t at = valid ? j : fallback;
    const std::int64_t flat = (b * in.g.heads_kv + hk) * in.g.seqlen_kv + at;
    t.key_position(e) = at;
    t.key_flags(e) = (valid ? kKeyValid : 0) | (in.k_finite(flat) ? kKFinite : 0) | (in.v_finite(flat) ? kVFinite : 0);
  }

  KOKKOS_INLINE_FUNCTION bool visible(const Tile& t, std::int64_t r, std::int64_t e) const {
    const std::int64_t j = t.key_position(e);
    return (t.key_flags(e) & kKeyValid) && j >= t.key_begin(r) && j < t.key_end(r);
  }

  /// One micro-tile of out = rows keys^T: kMicroRows rows (strided by
  /// row_groups) by kMicroKeys keys (strided by key_groups), over dim columns.
  KOKKOS_INLINE_FUNCTION void dot_tile(const Tile& t, const DeviceArray<const double, 4>& rows,
                                       const DeviceArray<const double, 4>& keys, std::int64_t dim, std::int64_t b,
                                       std::int64_t h, std::int64_t hk, std::int64_t row_group, std::int64_t key_group,
                                       const ScratchArray<double>& out) const {
    const double* row_at[kMicroRows];
    const double* key_at[kMicroKeys];
    for (std::int64_t a = 0; a < kMicroRows; ++a) row_at[a] = &rows(b, h, t.row_position(row_group + a * row_groups), 0);
    for (std::int64_t e = 0; e < kMicroKeys; ++e) key_at[e] = &keys(b, hk, t.key_position(key_group + e * key_groups), 0);
    double dot[kMicroRows][kMicroKeys] = {};
    for (std::int64_t c = 0; c < dim; ++c) {
      double row_value[kMicroRows], key_value[kMicroKeys];
      for (std::int64_t a = 0; a < kMicroRows; ++a) row_value[a] = row_at[a][c];
      for (std::int64_t e = 0; e < kMicroKeys; ++e) key_value[e] = key_at[e][c];
      for (std::int64_t a = 0; a < kMicroRows; ++a)
        for (std::int64_t e = 0; e < kMicroKeys; ++e) dot[a][e] += row_value[a] * key_value[e];
    }
    for (std::int64_t a = 0; a < kMicroRows; ++a)
      for (std::int64_t e = 0; e < kMicroKeys; ++e)
        out((row_group + a * row_groups) * s_stride + key_group + e * key_groups) = dot[a][e];
  }

  /// Phase A: p = Q K^T (unscaled) and ds = dO V^T over the whole tile.
  KOKKOS_INLINE_FUNCTION void logits_and_dp(const Team& team, const Tile& t, std::int64_t b, std::int64_t h,
                                            std::int64_t hk) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, row_groups * key_groups), [&](const std::int64_t item) {
      const std::int64_t row_group = item / key_groups, key_group = item % key_groups;
      dot_tile(t, in.q, in.k, in.g.head_dim, b, h, hk, row_group, key_group, t.p);
      dot_tile(t, in.dout, in.v, in.g.head_dim_v, b, h, hk, row_group, key_group, t.ds);
    });
  }

  /// Phase B: P = exp(m(scale S) - LSE) and dS = P (dP - D) m'(scale S) on
  /// visible pairs (m: the score modifications of query head h, identity
  /// without), 0 elsewhere.
  KOKKOS_INLINE_FUNCTION void probabilities(const Team& team, const Tile& t, std::int64_t h, std::int64_t lq,
                                            std::int64_t lk) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_padded * keys_padded), [&](const std::int64_t item) {
      const std::int64_t r = item / keys_padded, e = item % keys_padded;
      const std::int64_t at = r * s_stride + e;
      if (!visible(t, r, e)) {
        t.p(at) = 0;
        t.ds(at) = 0;
        return;
      }
      const double scaled = in.scale * t.p(at);
      const double logit =
          in.modify.active() ? in.modify(scaled, h, t.row_position(r), t.key_position(e), lq, lk) : scaled;
      const double probability = exp(logit - t.row_lse(r));
      t.p(at) = probability;
      t.ds(at) = probability * (t.ds(at) - t.row_delta(r)) * in.modify.derivative(scaled);
    });
  }
};

/// dK and dV of a block of key rows, over every query row of every head of
/// the block's GQA group.
template <class Space>
struct KeyBlockGradients : GradientTiles<Space> {
  using Base = GradientTiles<Space>;
  using typename Base::Team;
  using typename Base::Tile;
  using Base::in;
  using Base::kMicroCols;
  using Base::kMicroKeys;
  using Base::key_groups;
  using Base::keys_padded;
  using Base::rows_padded;
  using Base::s_stride;
  using Base::tile_keys;
  using Base::tile_rows;

  DeviceArray<const std::int64_t, 1> kv_position;  // the computed key rows (sorted)
  DeviceArray<double, 4> dk, dv;  // [batch][heads_kv][kv rows][d or dv]
  std::int64_t key_blocks = 0, cols_k = 0, cols_v = 0;

  void prepare() {
    this->prepare_tiles();
    key_blocks = (kv_position.extent(0) + tile_keys - 1) / tile_keys;
    cols_v = (in.g.head_dim_v + kMicroCols - 1) / kMicroCols;
    cols_k = (in.g.head_dim + kMicroCols - 1) / kMicroCols;
  }
  std::int64_t league_size() const { return in.g.batch * in.g.heads_kv * key_blocks; }

  KOKKOS_INLINE_FUNCTION void operator()(const Team& team) const {
    const std::int64_t block = team.league_rank() % key_blocks;
    const std::int64_t hk = team.league_rank() / key_blocks % in.g.heads_kv;
    const std::int64_t b = team.league_rank() / (key_blocks * in.g.heads_kv);
    const std::int64_t first = block * tile_keys, nkv = kv_position.extent(0);
    const std::int64_t count = first + tile_keys < nkv ? tile_keys : nkv - first;
    const std::int64_t lq = in.len_q(b), lk = in.len_kv(b);
    const Tile t = this->make_tile(team);

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count * in.g.head_dim), [&](const std::int64_t n) {
      dk(b, hk, first + n / in.g.head_dim, n % in.g.head_dim) = 0;
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count * in.g.head_dim_v), [&](const std::int64_t n) {
      dv(b, hk, first + n / in.g.head_dim_v, n % in.g.head_dim_v) = 0;
    });
    // The block's keys within the sequence; kv_position is sorted, so they
    // come first and span [lowest, highest].
    std::int64_t valid_keys = 0;
    while (valid_keys < count && kv_position(first + valid_keys) < lk) ++valid_keys;
    if (valid_keys == 0 || lq == 0) return;  // padding keys only, or no query: dK = dV = 0
    const std::int64_t lowest = kv_position(first), highest = kv_position(first + valid_keys - 1);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, keys_padded), [&](const std::int64_t e) {
      this->set_key(t, e, e < valid_keys, e < valid_keys ? kv_position(first + e) : 0, lowest, b, hk);
    });

    for (std::int64_t g = 0; g < in.g.group; ++g) {
      const std::int64_t h = hk * in.g.group + g;
      for (std::int64_t tile_start = 0; tile_start < lq; tile_start += tile_rows) {
        team.team_barrier();  // the previous tile's phase C is done with the scratch
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_padded), [&](const std::int64_t r) {
          const std::int64_t i = tile_start + r;
          this->set_row(t, r, r < tile_rows && i < lq, i, tile_start, b, h, lq, lk);
        });
        team.team_barrier();
        // Skip a tile where no row sees a key of the block (the same answer on
        // every thread of the team).
        bool any = false;
        for (std::int64_t r = 0; r < rows_padded && !any; ++r)
          any = t.key_begin(r) < t.key_end(r) && t.key_begin(r) <= highest && t.key_end(r) > lowest;
        if (!any) continue;
        this->logits_and_dp(team, t, b, h, hk);
        team.team_barrier();
        this->probabilities(team, t, h, lq, lk);
        team.team_barrier();
        accumulate(team, t, b, h, hk, tile_start < lq - tile_rows ? tile_rows : lq - tile_start);
      }
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count * in.g.head_dim), [&](const std::int64_t n) {
      dk(b, hk, first + n / in.g.head_dim, n % in.g.head_dim) *= in.scale;
    });
  }

  /// Phase C: dV += P^T dO and dK += dS^T Q over the tile's rows, in micro-tiles
  /// of kMicroKeys keys x kMicroCols columns.
  KOKKOS_INLINE_FUNCTION void accumulate(const Team& team, const Tile& t, std::int64_t b, std::int64_t h,
                                         std::int64_t hk, std::int64_t rows_here) const {
    const std::int64_t first = (team.league_rank() % key_blocks) * tile_keys, nkv = kv_position.extent(0);
    const std::int64_t count = first + tile_keys < nkv ? tile_keys : nkv - first;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, key_groups * (cols_v + cols_k)), [&](const std::int64_t item) {
      const std::int64_t key_group = item % key_groups, column_item = item / key_groups;
      const bool for_dv = column_item < cols_v;
      const std::int64_t col_group = for_dv ? column_item : column_item - cols_v;
      const std::int64_t col_groups = for_dv ? cols_v : cols_k, dim = for_dv ? in.g.head_dim_v : in.g.head_dim;
      const DeviceArray<double, 4>& out = for_dv ? dv : dk;
      const DeviceArray<const double, 4>& rows = for_dv ? in.dout : in.q;
      const double* weights = for_dv ? t.p.data() : t.ds.data();
      const int finite_bit = for_dv ? Base::kDoutFinite : Base::kQFinite;
      std::int64_t column[kMicroCols];
      for (std::int64_t c = 0; c < kMicroCols; ++c) {
        const std::int64_t col = col_group + c * col_groups;
        column[c] = col < dim ? col : dim - 1;  // past the end: computed, never stored
      }
      bool active[kMicroKeys];
      bool any_active = false;
      for (std::int64_t e = 0; e < kMicroKeys; ++e) {
        active[e] = key_group + e * key_groups < count;
        any_active = any_active || active[e];
      }
      if (!any_active) return;
      double accumulator[kMicroKeys][kMicroCols];
      for (std::int64_t e = 0; e < kMicroKeys; ++e)
        for (std::int64_t c = 0; c < kMicroCols; ++c)
          accumulator[e][c] = active[e] ? out(b, hk, first + key_group + e * key_groups, column[c]) : 0.0;
      for (std::int64_t r = 0; r < rows_here; ++r) {
        double weight[kMicroKeys], value[kMicroCols];
        for (std::int64_t e = 0; e < kMicroKeys; ++e) weight[e] = weights[r * s_stride + key_group + e * key_groups];
        const double* row = &rows(b, h, t.row_position(r), 0);
        for (std::int64_t c = 0; c < kMicroCols; ++c) value[c] = row[column[c]];
        if (t.row_flags(r) & finite_bit) {
          for (std::int64_t e = 0; e < kMicroKeys; ++e)
            for (std::int64_t c = 0; c < kMicroCols; ++c) accumulator[e][c] += weight[e] * value[c];
        } else {
          for (std::int64_t e = 0; e < kMicroKeys; ++e) {
            if (!this->visible(t, r, key_group + e * key_groups)) continue;
            for (std::int64_t c = 0; c < kMicroCols; ++c) accumulator[e][c] += weight[e] * value[c];
          }
        }
      }
      for (std::int64_t e = 0; e < kMicroKeys; ++e) {
        if (!active[e]) continue;
        for (std::int64_t c = 0; c < kMicroCols; ++c)
          if (col_group + c * col_groups < dim) out(b, hk, first + key_group + e * key_groups, column[c]) = accumulator[e][c];
      }
    });
  }
};

/// dQ of a block of query rows, over the keys in tiles.
template <class Space>
struct QueryBlockGradient : GradientTiles<Space> {
  using Base = GradientTiles<Space>;
  using typename Base::Team;
  using typename Base::Tile;
  using Base::in;
  using Base::kMicroCols;
  using Base::kMicroRows;
  using Base::keys_padded;
  using Base::row_groups;
  using Base::rows_padded;
  using Base::s_stride;
  using Base::tile_keys;
  using Base::tile_rows;

  DeviceArray<const std::int64_t, 1> q_position;  // the computed query rows (sorted)
  DeviceArray<double, 4> dq;  // [batch][heads][q rows][d]
  std::int64_t row_blocks = 0, col_groups = 0;

  void prepare() {
    this->prepare_tiles();
    row_blocks = (q_position.extent(0) + tile_rows - 1) / tile_rows;
    col_groups = (in.g.head_dim + kMicroCols - 1) / kMicroCols;
  }
  std::int64_t league_size() const { return in.g.batch * in.g.heads * row_blocks; }

  KOKKOS_INLINE_FUNCTION void operator()(const Team& team) const {
    const std::int64_t block = team.league_rank() % row_blocks;
    const std::int64_t h = team.league_rank() / row_blocks % in.g.heads;
    const std::int64_t b = team.league_rank() / (row_blocks * in.g.heads);
    const std::int64_t hk = h / in.g.group;
    const std::int64_t first = block * tile_rows, nq = q_position.extent(0);
    const std::int64_t count = first + tile_rows < nq ? tile_rows : nq - first;
    const std::int64_t lq = in.len_q(b), lk = in.len_kv(b);
    const Tile t = this->make_tile(team);

    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count * in.g.head_dim), [&](const std::int64_t n) {
      dq(b, h, first + n / in.g.head_dim, n % in.g.head_dim) = 0;
    });
    if (lq == 0 || lk == 0) return;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, rows_padded), [&](const std::int64_t r) {
      const std::int64_t i = r < count ? q_position(first + r) : 0;
      this->set_row(t, r, r < count && i < lq, i, q_position(first), b, h, lq, lk);
    });
    team.team_barrier();
    // The keys any row of the block sees; tiles start at multiples of Bc from key 0.
    std::int64_t lowest = lk, highest = 0;
    for (std::int64_t r = 0; r < rows_padded; ++r)
      if (t.key_end(r) > t.key_begin(r)) {
        lowest = t.key_begin(r) < lowest ? t.key_begin(r) : lowest;
        highest = t.key_end(r) > highest ? t.key_end(r) : highest;
      }
    for (std::int64_t tile_start = lowest / tile_keys * tile_keys; tile_start < highest; tile_start += tile_keys) {
      const std::int64_t tile_end = tile_start + tile_keys < lk ? tile_start + tile_keys : lk;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, keys_padded), [&](const std::int64_t e) {
        const std::int64_t j = tile_start + e;
        this->set_key(t, e, j < tile_end, j, tile_end - 1, b, hk);
      });
      team.team_barrier();
      this->logits_and_dp(team, t, b, h, hk);
      team.team_barrier();
      this->probabilities(team, t, h, lq, lk);
      team.team_barrier();
      accumulate(team, t, b, h, hk, first, count, tile_end - tile_start);
      team.team_barrier();  // phase C is done with the scratch before the next tile's keys
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, count * in.g.head_dim), [&](const std::int64_t n) {
      dq(b, h, first + n / in.g.head_dim, n % in.g.head_dim) *= in.scale;
    });
  }

  /// Phase C: dQ += dS K over the tile's keys, in micro-tiles of kMicroRows
  /// rows x kMicroCols columns.
  KOKKOS_INLINE_FUNCTION void accumulate(const Team& team, const Tile& t, std::int64_t b, std::int64_t h,
                                         std::int64_t hk, std::int64_t first, std::int64_t count,
                                         std::int64_t keys_here) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, row_groups * col_groups), [&](const std::int64_t item) {
      const std::int64_t row_group = item / col_groups, col_group = item % col_groups;
      const std::int64_t dim = in.g.head_dim;
      bool active[kMicroRows];
      bool any_active = false;
      for (std::int64_t a = 0; a < kMicroRows; ++a) {
        const std::int64_t r = row_group + a * row_groups;
        active[a] = r < count && t.key_end(r) > t.key_begin(r);
        any_active = any_active || active[a];
      }
      if (!any_active) return;
      std::int64_t column[kMicroCols];
      for (std::int64_t c = 0; c < kMicroCols; ++c) {
        const std::int64_t col = col_group + c * col_groups;
        column[c] = col < dim ? col : dim - 1;  // past the end: computed, never stored
      }
      double accumulator[kMicroRows][kMicroCols];
      for (std::int64_t a = 0; a < kMicroRows; ++a)
        for (std::int64_t c = 0; c < kMicroCols; ++c)
          accumulator[a][c] = active[a] ? dq(b, h, first + row_group + a * row_groups, column[c]) : 0.0;
      for (std::int64_t e = 0; e < keys_here; ++e) {
        double weight[kMicroRows], value[kMicroCols];
        for (std::int64_t a = 0; a < kMicroRows; ++a) weight[a] = t.ds((row_group + a * row_groups) * s_stride + e);
        const double* key = &in.k(b, hk, t.key_position(e), 0);
        for (std::int64_t c = 0; c < kMicroCols; ++c) value[c] = key[column[c]];
        if (t.key_flags(e) & Base::kKFinite) {
          for (std::int64_t a = 0; a < kMicroRows; ++a)
            for (std::int64_t c = 0; c < kMicroCols; ++c) accumulator[a][c] += weight[a] * value[c];
        } else {
          for (std::int64_t a = 0; a < kMicroRows; ++a) {
            if (!this->visible(t, row_group + a * row_groups, e)) continue;
            for (std::int64_t c = 0; c < kMicroCols; ++c) accumulator[a][c] += weight[a] * value[c];
          }
        }
      }
      for (std::int64_t a = 0; a < kMicroRows; ++a) {
        if (!active[a]) continue;
        for (std::int64_t c = 0; c < kMicroCols; ++c)
          if (col_group + c * col_groups < dim) dq(b, h, first + row_group + a * row_groups, column[c]) = accumulator[a][c];
      }
    });
  }
};

}  // namespace flashcheck::kokkos_attention
