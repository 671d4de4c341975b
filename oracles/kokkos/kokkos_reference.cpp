// The Kokkos reference's host side: the runtime, the inputs staged in the
// execution space's memory (raw storage copied, then decoded there), the
// kernel of kokkos_attention.hpp launched on the space asked for, and the
// results copied back.
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

#include <Kokkos_Core.hpp>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "flashcheck/oracles/kokkos/kokkos_attention.hpp"

namespace flashcheck {
namespace {

namespace ka = kokkos_attention;

// View extents as size_t: Kokkos 4's mdspan-based View rejects signed extents under nvcc.
std::size_t extent(std::int64_t n) { return static_cast<std::size_t>(n); }

// (No fmt here: its compile-time format strings do not compile under nvcc.)
std::string text(std::int64_t n) { return std::to_string(n); }

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

bool gpu_present() {
#ifdef KOKKOS_ENABLE_CUDA
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
#else
  return false;
#endif
}

ka::MaskSpec mask_spec(const Problem& p) {
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

ka::StorageCode storage_code(DType dtype) {
  switch (dtype) {
    case DType::f32: return ka::StorageCode::f32;
    case DType::f16: return ka::StorageCode::f16;
    case DType::bf16: return ka::StorageCode::bf16;
  }
  throw std::invalid_argument("Kokkos reference: unknown storage dtype");
}

// Decodes a raw [batch, heads, seq, dim] tensor (bhsd or bshd, f32 or 16-bit
// bits) into `out` [batch][heads][rows][dim], row r taken from position(r)
// (every position when `position` is empty).
template <class Space, class Acc>
struct DecodeTensor {
  ka::DeviceArray<Acc, 4> out;
  ka::DeviceArray<const std::uint16_t, 1> half_bits;
  ka::DeviceArray<const float, 1> single;
  ka::DeviceArray<const std::int64_t, 1> position;  // empty: row r is position r
  ka::StorageCode code;
  bool bshd;
  std::int64_t heads, seqlen, dim;

  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    const std::int64_t rows = out.extent(2);
    const std::int64_t c = index % dim, r = index / dim % rows, h = index / (dim * rows) % heads,
                       b = index / (dim * rows * heads);
    const std::int64_t s = position.extent(0) > 0 ? position(r) : r;
    const std::int64_t at = bshd ? ((b * seqlen + s) * heads + h) * dim + c : ((b * heads + h) * seqlen + s) * dim + c;
    const double value = code == ka::StorageCode::f32 ? static_cast<double>(single(at))
                                                      : ka::decode_half(code, half_bits(at));
    out(b, h, r, c) = static_cast<Acc>(value);
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
      all = all && (x - x == x - x);  // false for NaN and +-Inf
    }
    finite(index) = all;
  }
};

// A host tensor's storage in the space's memory, decoded to Acc. The raw copy
// lives until the decoding kernel is done (the space is fenced before return).
template <class Space, class Acc>
Kokkos::View<Acc****, Kokkos::LayoutRight, Space> stage(const HostTensor& tensor, const char* label,
                                                        Kokkos::View<const std::int64_t*, Space> position,
                                                        std::int64_t rows) {
  Kokkos::View<Acc****, Kokkos::LayoutRight, Space> out(std::string(label), extent(tensor.batch()), extent(tensor.heads()), extent(rows),
                                                        extent(tensor.dim()));
  DecodeTensor<Space, Acc> decode{ka::device_array<Acc>(out), {}, {}, ka::device_array<const std::int64_t>(position),
                                  storage_code(tensor.dtype()), tensor.layout() == Layout::bshd,
                                  tensor.heads(), tensor.seqlen(), tensor.dim()};
  const auto elements = static_cast<std::size_t>(tensor.size());
  Kokkos::View<float*, Space> raw_single;
  Kokkos::View<std::uint16_t*, Space> raw_half;
  if (tensor.dtype() == DType::f32) {
    raw_single = Kokkos::View<float*, Space>("raw", elements);
    Kokkos::deep_copy(raw_single, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                      static_cast<const float*>(tensor.data()), elements));
    decode.single = ka::device_array<const float>(raw_single);
  } else {
    raw_half = Kokkos::View<std::uint16_t*, Space>("raw", elements);
    Kokkos::deep_copy(raw_half, Kokkos::View<const std::uint16_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                    static_cast<const std::uint16_t*>(tensor.data()), elements));
    decode.half_bits = ka::device_array<const std::uint16_t>(raw_half);
  }
  Kokkos::parallel_for("flashcheck::kokkos::decode", Kokkos::RangePolicy<Space>(0, out.size()), decode);
  Space().fence();
  return out;
}

constexpr std::int64_t kMaxTile = 1024;
constexpr std::int64_t kGpuTeamSize = 128;

template <class Space, class Acc>
ka::TiledOnlineSoftmax<Space, Acc> make_kernel(const Problem& p, std::int64_t rows, KokkosTiling tiling) {
  ka::TiledOnlineSoftmax<Space, Acc> kernel;
  kernel.g = {p.batch, p.heads_q, p.heads_kv, p.group_size(), rows, p.head_dim, p.head_dim_v, p.seqlen_kv};
  kernel.mask = mask_spec(p);
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
  const auto k = stage<Space, Acc>(in.k, "k", {}, p.seqlen_kv);
  const auto v = stage<Space, Acc>(in.v, "v", {}, p.seqlen_kv);
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

// Rounds every element of a float view to the working dtype.
template <class Space>
struct RoundToWorking {
  ka::DeviceArray<float, 4> values;
  ka::StorageCode working;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t index) const {
    values.data[index] = ka::round_working(working, values.data[index]);
  }
};

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
  kernel.working = storage_code(working);
  kernel.scale = static_cast<float>(p.softmax_scale);
  kernel.minus_infinity = -std::numeric_limits<float>::infinity();
  kernel.not_a_number = std::numeric_limits<float>::quiet_NaN();
  // Inputs in f32 (exact), rounded to the working dtype when it is narrower.
  auto q = stage<Space, float>(in.q, "q", position, nrows);
  auto k = stage<Space, float>(in.k, "k", {}, p.seqlen_kv);
  auto v = stage<Space, float>(in.v, "v", {}, p.seqlen_kv);
  for (auto* tensor : {&q, &k, &v})
    Kokkos::parallel_for("flashcheck::kokkos::round_inputs", Kokkos::RangePolicy<Space>(0, tensor->size()),
                         RoundToWorking<Space>{ka::device_array<float>(*tensor), kernel.working});
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

void require_runtime(KokkosSpace space) {
  if (!kokkos_available())
    throw std::runtime_error("the Kokkos reference cannot run here: this Kokkos has CUDA and no GPU is present");
  if (space == KokkosSpace::device && !kokkos_device_available())
    throw std::runtime_error("the Kokkos reference has no device here (" + kokkos_description() + ")");
  KokkosRuntime::ensure();
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
