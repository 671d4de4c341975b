// The Kokkos references' host side, shared by the forward (kokkos_reference.cpp)
// and the backward (kokkos_backward.cpp): the runtime, the mask and dtype codes,
// inputs staged in the execution space's memory (raw storage copied, then
// decoded there), per-row finiteness marks, the per-sequence lengths, and the
// forward kernel made and its tiling fitted to the team scratch. A
// private header of oracles/kokkos: it includes Kokkos, and is compiled as
// CUDA with a CUDA Kokkos.
#pragma once

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <mutex>
#include <stdexcept>
#include <string>

#include "flashcheck/core/tensor.hpp"
#include "flashcheck/oracles/kokkos/kokkos_attention.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck::kokkos_host {

namespace ka = kokkos_attention;

// View extents as size_t: Kokkos 4's mdspan-based View rejects signed extents under nvcc.
inline std::size_t extent(std::int64_t n) { return static_cast<std::size_t>(n); }

// (No fmt here: its compile-time format strings do not compile under nvcc.)
inline std::string text(std::int64_t n) { return std::to_string(n); }

// Kokkos is initialised once per process, on first use, and finalised at exit.
class KokkosRuntime {
 public:
  static void ensure() {
    static std::once_flag once;
    std::call_once(once, [] {
      if (!Kokkos::is_initialized()) {
#if KOKKOS_VERSION >= 30700
        Kokkos::InitializationSettings settings;
        settings.set_disable_warnings(true);
        Kokkos::initialize(settings);
#else
        Kokkos::InitArguments arguments;
        arguments.disable_warnings = true;
        Kokkos::initialize(arguments);
#endif
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

inline bool gpu_present() {
#ifdef KOKKOS_ENABLE_CUDA
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
#else
  return false;
#endif
}

inline ka::MaskSpec mask_spec(const Problem& p) {
  ka::MaskSpec mask;
  switch (p.mask) {
    case MaskKind::none: mask.kind = ka::MaskCode::none; break;
    case MaskKind::causal_tl: mask.kind = ka::MaskCode::causal_tl; break;
    case MaskKind::causal_br: mask.kind = ka::MaskCode::causal_br; break;
    case MaskKind::window: mask.kind = ka::MaskCode::window; break;
  }
  mask.left = p.window_left;
  mask.right = p.window_right;
  return mask;
}

inline ka::ScoreModSpec score_mod(const Problem& p) {
  ka::ScoreModSpec modify;
  modify.softcap = p.softcap;
  modify.alibi = p.alibi;
  modify.heads = p.heads_q;
  return modify;
}

inline ka::StorageCode storage_code(DType dtype) {
  switch (dtype) {
    case DType::f32: return ka::StorageCode::f32;
    case DType::f16: return ka::StorageCode::f16;
    case DType::bf16: return ka::StorageCode::bf16;
    case DType::e4m3: return ka::StorageCode::e4m3;
    case DType::e5m2: return ka::StorageCode::e5m2;
  }
  throw std::invalid_argument("Kokkos reference: unknown storage dtype");
}

// A host tensor's elements as a decoding kernel reads them in the space's
// memory: f32, 16-bit or 8-bit patterns (run_decoder fills in the arrays),
// the value of an fp8 one being its pattern's times the tensor's descale.
struct StoredElements {
  ka::StorageCode code = ka::StorageCode::f32;
  ka::DeviceArray<const float, 1> single{};
  ka::DeviceArray<const std::uint16_t, 1> half_bits{};
  ka::DeviceArray<const std::uint8_t, 1> byte_bits{};
  double descale = 1;
  KOKKOS_INLINE_FUNCTION double value_at(std::int64_t at) const {
    if (code == ka::StorageCode::f32) return static_cast<double>(single(at));
    if (ka::is_fp8(code)) return ka::decode_fp8(code, byte_bits(at)) * descale;
    return ka::decode_half(code, half_bits(at));
  }
};

// Decodes a raw [batch, heads, seq, dim] tensor (bhsd or bshd, any storage
// dtype) into `out` [batch][heads][rows][dim], row r taken from position(r)
// (every position when `position` is empty).
template <class Space, class Acc>
struct DecodeTensor {
  ka::DeviceArray<Acc, 4> out;
  StoredElements stored;
  ka::DeviceArray<const std::int64_t, 1> position;  // empty: row r is position r
  bool bshd;
  std::int64_t heads, seqlen, dim;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t rows = out.extent(2);
    const std::int64_t c = index % dim, r = index / dim % rows, h = index / (dim * rows) % heads,
                       b = index / (dim * rows * heads);
    const std::int64_t s = position.extent(0) > 0 ? position(r) : r;
    const std::int64_t at = bshd ? ((b * seqlen + s) * heads + h) * dim + c : ((b * heads + h) * seqlen + s) * dim + c;
    out(b, h, r, c) = static_cast<Acc>(stored.value_at(at));
  }
};

// Per (batch, kv head, key): whether that V row is all finite.
template <class Space, class Acc>
struct MarkFiniteRows {
  ka::DeviceArray<const Acc, 4> v;
  ka::DeviceArray<int, 1> finite;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t keys = v.extent(2), heads = v.extent(1);
    const std::int64_t j = index % keys, hk = index / keys % heads, b = index / (keys * heads);
    int all = 1;
    for (std::int64_t c = 0; c < v.extent(3); ++c) {
      const Acc x = v(b, hk, j, c);
      all = all && ka::finite(static_cast<double>(x));
    }
    finite(index) = all;
  }
};

// Rounds every element of a float view to the working dtype.
template <class Space>
struct RoundToWorking {
  ka::DeviceArray<float, 4> values;
  ka::StorageCode working;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    values.data[index] = ka::round_working(working, values.data[index]);
  }
};

// Gathers a paged pool ([pages, heads, page_size, dim], bhsd or bshd) into
// `out` [batch][heads][seqlen_kv][dim] through the page table [batch,
// per_sequence]: key s of sequence b is slot s % page_size of pool page
// table(b, s / page_size).
template <class Space, class Acc>
struct GatherPages {
  ka::DeviceArray<Acc, 4> out;
  StoredElements stored;
  ka::DeviceArray<const std::int32_t, 1> table;
  bool bshd;
  std::int64_t page_size, per_sequence;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t dim = out.extent(3), keys = out.extent(2), heads = out.extent(1);
    const std::int64_t c = index % dim, s = index / dim % keys, h = index / (dim * keys) % heads,
                       b = index / (dim * keys * heads);
    const std::int64_t page = table(b * per_sequence + s / page_size), slot = s % page_size;
    const std::int64_t at = bshd ? ((page * page_size + slot) * heads + h) * dim + c
                                 : ((page * heads + h) * page_size + slot) * dim + c;
    out(b, h, s, c) = static_cast<Acc>(stored.value_at(at));
  }
};

// A host tensor's raw storage copied into the space's memory, as f32, as
// 16-bit or as 8-bit patterns; the views live as long as this does.
template <class Space>
struct RawStorage {
  Kokkos::View<float*, Space> single;
  Kokkos::View<std::uint16_t*, Space> half;
  Kokkos::View<std::uint8_t*, Space> bytes;
  explicit RawStorage(const HostTensor& tensor) {
    const auto elements = static_cast<std::size_t>(tensor.size());
    if (is_fp8(tensor.dtype())) {
      bytes = Kokkos::View<std::uint8_t*, Space>("raw", elements);
      Kokkos::deep_copy(bytes, Kokkos::View<const std::uint8_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                   static_cast<const std::uint8_t*>(tensor.data()), elements));
    } else if (tensor.dtype() == DType::f32) {
      single = Kokkos::View<float*, Space>("raw", elements);
      Kokkos::deep_copy(single, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                    static_cast<const float*>(tensor.data()), elements));
    } else {
      half = Kokkos::View<std::uint16_t*, Space>("raw", elements);
      Kokkos::deep_copy(half, Kokkos::View<const std::uint16_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                  static_cast<const std::uint16_t*>(tensor.data()), elements));
    }
  }
};

// Runs a decoding kernel (DecodeTensor, GatherPages) over `elements` outputs,
// on the tensor's raw storage copied in, and waits for it.
template <class Space, class Kernel>
void run_decoder(Kernel kernel, const HostTensor& tensor, std::size_t elements, const char* name) {
  const RawStorage<Space> raw(tensor);
  kernel.stored.single = ka::device_array<const float>(raw.single);
  kernel.stored.half_bits = ka::device_array<const std::uint16_t>(raw.half);
  kernel.stored.byte_bits = ka::device_array<const std::uint8_t>(raw.bytes);
  kernel.stored.descale = tensor.descale();
  Kokkos::parallel_for(name, Kokkos::RangePolicy<Space>(0, elements), kernel);
  Space().fence();
}

// A host tensor's storage in the space's memory, decoded to Acc. The raw copy
// lives until the decoding kernel is done (the space is fenced before return).
template <class Space, class Acc>
Kokkos::View<Acc****, Kokkos::LayoutRight, Space> stage(const HostTensor& tensor, const char* label,
                                                        Kokkos::View<const std::int64_t*, Space> position,
                                                        std::int64_t rows) {
  Kokkos::View<Acc****, Kokkos::LayoutRight, Space> out(std::string(label), extent(tensor.batch()), extent(tensor.heads()), extent(rows),
                                                        extent(tensor.dim()));
  DecodeTensor<Space, Acc> decode{ka::device_array<Acc>(out), StoredElements{storage_code(tensor.dtype())},
                                  ka::device_array<const std::int64_t>(position), tensor.layout() == Layout::bshd,
                                  tensor.heads(), tensor.seqlen(), tensor.dim()};
  run_decoder<Space>(decode, tensor, out.size(), "flashcheck::kokkos::decode");
  return out;
}

// A paged pool's keys in the space's memory, read through the page table and
// decoded to Acc: [batch][heads][seqlen_kv][dim], as stage gives a contiguous
// K or V (the keys past a sequence's length are whatever its last page's
// slots or spare page hold: the kernels never read them).
template <class Space, class Acc>
Kokkos::View<Acc****, Kokkos::LayoutRight, Space> stage_paged(const HostTensor& pool, const PageTable& table,
                                                              const char* label, std::int64_t batch,
                                                              std::int64_t seqlen_kv) {
  Kokkos::View<Acc****, Kokkos::LayoutRight, Space> out(std::string(label), extent(batch), extent(pool.heads()),
                                                        extent(seqlen_kv), extent(pool.dim()));
  Kokkos::View<std::int32_t*, Space> entries("page_table", table.entries.size());
  Kokkos::deep_copy(entries, Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                 table.entries.data(), table.entries.size()));
  GatherPages<Space, Acc> gather{ka::device_array<Acc>(out), StoredElements{storage_code(pool.dtype())},
                                 ka::device_array<const std::int32_t>(entries), pool.layout() == Layout::bshd,
                                 table.page_size, table.per_sequence};
  run_decoder<Space>(gather, pool, out.size(), "flashcheck::kokkos::gather_pages");
  return out;
}

// A K or V input staged as stage gives it, through the page table when the problem is paged.
template <class Space, class Acc>
Kokkos::View<Acc****, Kokkos::LayoutRight, Space> stage_keys(const Problem& p, const Inputs& in, const HostTensor& tensor,
                                                             const char* label) {
  if (p.page_size > 0) {
    if (const std::string mismatch = page_table_mismatch(p, in.pages); !mismatch.empty())
      throw std::invalid_argument("Kokkos reference: " + mismatch);
    return stage_paged<Space, Acc>(tensor, in.pages, label, p.batch, p.seqlen_kv);
  }
  return stage<Space, Acc>(tensor, label, {}, p.seqlen_kv);
}

// A staged f32 view rounded to the working dtype in place.
template <class Space>
Kokkos::View<float****, Kokkos::LayoutRight, Space> round_staged(Kokkos::View<float****, Kokkos::LayoutRight, Space> staged,
                                                                 ka::StorageCode working) {
  Kokkos::parallel_for("flashcheck::kokkos::round_inputs", Kokkos::RangePolicy<Space>(0, staged.size()),
                       RoundToWorking<Space>{ka::device_array<float>(staged), working});
  return staged;
}

// A host tensor staged in f32 (exact) and rounded to the working dtype where
// it is narrower: the same-precision baselines' inputs.
template <class Space>
Kokkos::View<float****, Kokkos::LayoutRight, Space> stage_rounded(const HostTensor& tensor, const char* label,
                                                                  Kokkos::View<const std::int64_t*, Space> position,
                                                                  std::int64_t rows, ka::StorageCode working) {
  return round_staged<Space>(stage<Space, float>(tensor, label, position, rows), working);
}

// The compared rows' positions and the per-sequence lengths, in the space's memory.
template <class Space>
struct RowGeometry {
  Kokkos::View<std::int64_t*, Space> position, len_q, len_kv;
  RowGeometry(const Problem& p, const RowSet& rows)
      : position("position", extent(rows.size())), len_q("len_q", extent(p.batch)), len_kv("len_kv", extent(p.batch)) {
    auto position_host = Kokkos::create_mirror_view(position);
    auto len_q_host = Kokkos::create_mirror_view(len_q);
    auto len_kv_host = Kokkos::create_mirror_view(len_kv);
    for (std::int64_t r = 0; r < rows.size(); ++r) position_host(r) = rows.rows[r];
    for (std::int64_t b = 0; b < p.batch; ++b) {
      len_q_host(b) = p.len_q(b);
      len_kv_host(b) = p.len_kv(b);
    }
    Kokkos::deep_copy(position, position_host);
    Kokkos::deep_copy(len_q, len_q_host);
    Kokkos::deep_copy(len_kv, len_kv_host);
  }
};

// The forward kernel for a problem (its rows: the computed query rows), and
// the tiling fitted to the space's team scratch.
inline constexpr std::int64_t kMaxTile = 1024;
inline constexpr std::int64_t kGpuTeamSize = 128;

template <class Space, class Acc>
ka::TiledOnlineSoftmax<Space, Acc> make_kernel(const Problem& p, std::int64_t rows, KokkosTiling tiling) {
  ka::TiledOnlineSoftmax<Space, Acc> kernel;
  kernel.g = {p.batch, p.heads_q, p.heads_kv, p.group_size(), rows, p.head_dim, p.head_dim_v, p.seqlen_kv};
  kernel.mask = mask_spec(p);
  kernel.modify = score_mod(p);
  kernel.scale = static_cast<Acc>(p.softmax_scale);
  kernel.minus_infinity = -std::numeric_limits<Acc>::infinity();
  kernel.not_a_number = std::numeric_limits<Acc>::quiet_NaN();
  kernel.rows_per_team = tiling.rows_per_team;
  kernel.key_tile = tiling.key_tile;
  kernel.prepare();
  return kernel;
}

template <class Space, class Acc>
KokkosTiling fit(const Problem& p, KokkosTiling tiling) {
  if (tiling.rows_per_team < 1 || tiling.rows_per_team > kMaxTile || tiling.key_tile < 1 ||
      tiling.key_tile > kMaxTile || tiling.team_size < 0)
    throw std::invalid_argument(
        "Kokkos tiling: rows_per_team and key_tile must be in [1, " + text(kMaxTile) + "], team_size >= 0");
  if (tiling.team_size == 0) tiling.team_size = std::is_same_v<Space, Kokkos::DefaultHostExecutionSpace> ? 1 : kGpuTeamSize;
  const auto limit = static_cast<std::size_t>(Kokkos::TeamPolicy<Space>::scratch_size_max(0));
  while (make_kernel<Space, Acc>(p, 1, tiling).scratch_bytes() > limit) {
    if (tiling.rows_per_team > 4) tiling.rows_per_team /= 2;
    else if (tiling.key_tile > 4) tiling.key_tile /= 2;
    else throw std::invalid_argument("Kokkos tiling: no tile fits the team scratch (" + text(static_cast<std::int64_t>(limit)) +
                                     " bytes)");
  }
  return tiling;
}

inline void require_runtime(KokkosSpace space) {
  if (!kokkos_available())
    throw std::runtime_error("the Kokkos reference cannot run here: this Kokkos has CUDA and no GPU is present");
  if (space == KokkosSpace::device && !kokkos_device_available())
    throw std::runtime_error("the Kokkos reference has no device here (" + kokkos_description() + ")");
  KokkosRuntime::ensure();
}


}  // namespace flashcheck::kokkos_host
