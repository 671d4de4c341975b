// cudnn: cuDNN's fused attention (SDPA) through the cuDNN frontend graph API,
// as a subject (and, by the judge, as the peer baseline of half-precision
// kernels).
//
// One graph per geometry (shapes, strides, dtype, mask, padding, scale), built
// once and cached. Masks map to the frontend's attributes: causal top-left and
// bottom-right, and the sliding window as a diagonal band aligned bottom-right
// (our window of W keys left of the diagonal is cuDNN's left bound W + 1, a
// window length that counts the diagonal key). Padded batches pass their
// lengths as [batch, 1, 1, 1] int32 tensors with the padding mask. LSE is
// cuDNN's softmax stats (natural log). Every refusal by cuDNN or the frontend
// (validation, no engine, unsupported head dim...) becomes `unsupported`
// carrying cuDNN's message, so the domain is discovered, not guessed.
//
// Nearly every generated case has a geometry of its own, and compiling a
// graph's kernel (NVRTC) is what made a new graph expensive. So graphs are
// built with the frontend's dynamic shapes and one kernel cache per topology
// (dtype, head dims, mask kind, which window bounds are set, padding; not the
// shapes, strides, scale or window sizes): the first graph of a topology compiles its kernel, and later
// geometries of the topology bind it from the cache (cuDNN 9.5 or newer). The
// frontend cannot build every case that way (dynamic shapes take its composite
// SDPA implementation only), so any failure of the dynamic path, at build or
// at execute, falls back to the plain per-geometry graph with the reason
// counted in stats(); a case is refused only when the plain graph refuses it
// too, so the domain is the one without dynamic shapes.
// FLASHCHECK_CUDNN_DYNAMIC=0 builds plain per-geometry graphs only (the
// behaviour before, for comparison).
//
// A kernel cache lives as long as its process, and the suite runs each
// property in a process of its own. With FLASHCHECK_CUDNN_CACHE_DIR set,
// each topology's cache is written there after its first build (JSON,
// cuDNN 9.10 or newer; a folder per cuDNN version, frontend version and
// compute capability; written to a temporary file and renamed, so concurrent
// processes never read half a file) and read back by the next process that
// meets the topology. A file that cuDNN will not read or build with is set
// aside for a fresh cache, with the reason counted.
//
// Where cuDNN refuses dynamic shapes (9.14's SDPA engines do), every new
// geometry compiles its own kernel: 0.7 s each on an H100, 89 of them in the
// quick tier's Gpu_cudnn (62 of its 67 s). So, in the same folder, each plain
// graph's built plan is serialized (Graph::serialize, which carries the
// runtime-compiled kernel) to a file named by a hash of its geometry, the
// geometry written first in the file so that a collision reads as a miss; the
// next process that meets the geometry deserializes the plan instead of
// compiling it. A plan file cuDNN will not load is rebuilt and rewritten, with
// the reason counted. The first run on a machine compiles; later runs of the
// same build (and of any build with the same cuDNN, frontend and GPU) do not.
//
// The backward (pass=bwd): the frontend's sdpa_backward on Q, K, V, O, dO and
// Stats, the judge's O and LSE (core/backward.hpp) handed as they are, with
// the forward's masks, padding, layouts and dtypes, and through the same graph
// caches, plan files and dynamic-shape fallback (a pass's graphs are keyed
// apart: the geometry and the topology name the pass). cuDNN sums dK and dV
// over a GQA group itself. set_deterministic_algorithm(true): on Hopper the
// frontend then takes its dP-workspace path (dQ = dS K as one GEMM, no atomic
// dQ accumulator; workspace b * hq * sq * skv * 2 bytes), on Blackwell (cuDNN
// 9.18+) its deterministic engine; the determinism test holds it to every bit.
// A workspace larger than the device's free memory is refused (unsupported,
// with its size), for either pass.
// The backward's head dims are narrower than the forward's and are cuDNN's to
// refuse at launch (frontend 1.32, CompositeSDPABackwardNode): d and dv <= 256
// on Hopper, <= 128 on Ampere/Ada, on Blackwell <= 128 or (192, 128) or (256,
// 256); and never s_q = s_kv = 1. Stats of a row that sees no key (fully
// masked, or padding) are flashcheck's -inf; the subject hands cuDNN +inf
// there instead, FlashAttention's own convention for such rows (its softmax
// writes LSE = +inf where the row sum is 0, so that exp(s - LSE) = 0 in the
// backward): whatever order a kernel masks and subtracts in, P = 0 on the row
// and its gradients are 0, where -inf - (-inf) would be NaN. (The test seam
// cudnn_testing::hand_stats_as_given shows what cuDNN does with -inf.)
// Padding rows of dQ, dK and dV are set to 0 after the call (flashcheck's
// convention; cuDNN's contract says nothing of them).
#include <cudnn.h>
#include <cudnn_frontend.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "flashcheck/core/gpu/gpu_subject.hpp"
#include "flashcheck/oracles/cudnn/cudnn_sdpa_testing.hpp"
#include "fp8_widen.hpp"

namespace flashcheck {
namespace {

namespace fe = cudnn_frontend;

// Failures of the dynamic-shape path still to inject (cudnn_testing).
int injected_build_failures = 0;
int injected_execute_failures = 0;

// Tensor uids of the variant pack.
enum Uid : std::int64_t {
  kQ = 1, kK, kV, kO, kStats, kSeqQ, kSeqKv, kdO, kdQ, kdK, kdV, kPageTableK, kPageTableV,
  // sdpa_fp8's scales (f32 scalars on the device) and amax outputs.
  kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO
};

// cudnn-fp8's P scale: P (at most 1) x 256 is quantized, and 1/256 undoes it
// (a power of two below e4m3's 448, so no P saturates and none is rounded twice).
constexpr float kFp8ScaleS = 256.0f;

// Whether the backward hands cuDNN Stats as given (-inf where a row sees no
// key) instead of +inf there (cudnn_testing).
bool stats_as_given = false;

constexpr Capabilities kCapabilities = {
    .dtypes = {DType::f16, DType::bf16},
    // cuDNN's fused kernels want head dims that are multiples of 8; which of
    // these a given cuDNN and GPU accept is discovered at launch.
    .head_dims = {32, 64, 80, 96, 128, 160, 192, 256},
    .max_head_dim_v = 256,
    .head_dim_v_equal = true,
    .masks = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window},
    .gqa = true,
    .varlen = true,
    // Paged K/V (cuDNN 9.5+: the frontend's page tables, with the padding mask's
    // lengths). Measured on the H100 (cuDNN 9.14, 2026-11-26): pages of 1, 2,
    // 16 ... 256 keys run; 3, 7 and 17 are refused at build_operation_graph
    // ("block size needs to be non-zero and a power of 2").
    .min_page_size = 1,
    .page_size_power_of_two = true,
    .lse = true,
    .empty_sequences = false,  // cuDNN takes no zero-length sequence dimension
    // Measured on the H200 (cuDNN 9.14): a NaN in V at a masked key makes that
    // output column NaN (masked probabilities multiply V as zeros), so
    // non-finite inputs are outside the domain; subnormal inputs are flushed to
    // zero in some configurations (bf16, d=192) and not in others (f16, d=80).
    .nonfinite_inputs = false,
    .may_flush_subnormals = true,
    .tile_q = 128,
    .tile_kv = 128,
    .needs_gpu = true,
    .min_compute_capability = 80,
    .accumulator_max = std::numeric_limits<float>::max(),  // measured: near_overflow(3000,0.9) bf16 gives -inf (issue 20)
    .aligned_masks_need_sq_le_skv = true,
    .geometry_pool = 24,
    .backward = true,
    .backward_deterministic = true,  // set_deterministic_algorithm(true) on every backward graph
    .backward_operands_in_dtype = true,  // P and dS in the dtype for its tensor-core products
    .backward_single_position = false,  // "s_q = s_kv = 1 is not supported" (sdpa_backward's validation)
    .known_deviations = "masked keys' non-finite values leak into O (0 x NaN); subnormal inputs may be flushed to zero; "
                        "bottom-right alignment (causal_br, window) with max seqlen_q > seqlen_kv is refused, and so "
                        "outside the domain (rows that see no key, padding or a sequence with more queries than "
                        "keys, get O = 0 and LSE = -inf as flashcheck's convention); the backward's head dims are "
                        "cuDNN's per architecture (d, dv <= 256 on Hopper, <= 128 on Ampere), the others refused at "
                        "launch",
};

// cudnn-fp8: cuDNN's fp8 SDPA forward (sdpa_fp8) on Hopper, the fp8 peer.
// cuDNN 9.14's frontend on sm_90 (measured 2026-11-27 on an H100; the
// frontend's sdpa_support_surface.h): O only in fp8 (a bf16 O needs sm_100),
// so O is written at V's descale in e4m3 and widened to bf16 after the call
// (fp8_output; the widening is the harness's, left out of timed launches);
// no bottom-right alignment (sm_100 too), so the masks are none and
// causal_tl; d = 128 here (the fp8 kernels the bench needs). e4m3
// and e5m2: cuDNN 9.14 took e5m2 on the H100 (2026-11-27, the e4m3 problems of
// `.devrun/fp8.problems` in e5m2: the 7 in this domain passed, ratios
// 0.22-0.49, and 131072 keys failed inside fp8_accumulator_keys, ratio 5.7).
constexpr Capabilities kFp8Capabilities = [] {
  Capabilities c = kCapabilities;
  c.dtypes = {DType::e4m3, DType::e5m2};
  c.head_dims = {128};
  c.max_head_dim_v = 128;
  c.masks = {MaskKind::none, MaskKind::causal_tl};
  c.min_page_size = 0;
  c.page_size_power_of_two = false;
  c.backward = false;
  c.backward_deterministic = false;
  c.backward_operands_in_dtype = false;
  c.backward_single_position = true;
  c.aligned_masks_need_sq_le_skv = false;
  c.product_accumulation_unit = 0x1p-13;  // the fp8 tensor cores' accumulation (subject.hpp)
  c.fp8_output = true;
  c.min_compute_capability = 90;  // fp8 SDPA is Hopper's and newer (the frontend's support surface)
  // Measured on an H100 (cuDNN 9.14, 2026-11-27): every seqlen_q = 1 refused
  // ("No valid engine configs", 38 of 402 fuzz cases), no other shape.
  c.min_seqlen_q = 2;
  // Measured on an H100 (cuDNN 9.14, 2026-11-27): O 0.67 off (of 0.8) at
  // 131072 keys of near-uniform weights, ratio 13.5; the accumulator model
  // (subject.hpp) says 2^13 keys.
  c.fp8_accumulator_keys = 8192;
  c.known_deviations = "masked keys' non-finite values leak into O (0 x NaN); O is written in fp8 (fp8_output)";
  return c;
}();

struct CachedGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  std::int64_t workspace_bytes = 0;
  bool dynamic = false;  // built with dynamic shapes and its topology's kernel cache
};

// A built graph, or why cuDNN or the frontend would not build it.
struct BuildOutcome {
  std::optional<CachedGraph> built;
  std::string refusal;
};

// One topology's kernel cache, and what became of it.
struct Topology {
  std::shared_ptr<fe::KernelCache> kernel_cache = std::make_shared<fe::KernelCache>();
  bool from_file = false;  // kernel_cache was read from FLASHCHECK_CUDNN_CACHE_DIR
  std::int64_t dynamic_builds = 0;
  std::string static_only;  // why this topology now builds plain graphs only (empty: it does not)
};

// Counters since the subject was created, for stats().
struct GraphCounters {
  std::int64_t launches = 0;
  std::int64_t graph_hits = 0;  // a geometry seen before: its graph reused, nothing built
  std::int64_t cold_builds = 0, warm_builds = 0, static_builds = 0;
  double cold_ms = 0, warm_ms = 0, static_ms = 0;
  std::int64_t revision_checked = 0, revision_hits = 0;  // warm builds the cache's own counter vouches for
  std::int64_t build_fallbacks = 0, execute_fallbacks = 0, refusals = 0;
  std::int64_t files_read = 0, files_written = 0, file_builds = 0;  // file_builds: first builds on a cache read from a file
  std::int64_t plans_read = 0, plans_written = 0, plans_rejected = 0;  // serialized plain graphs (plan files)
  double plans_read_ms = 0;
  std::vector<std::string> fallback_reasons;  // the first few distinct ones (file problems included)
};

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Why dynamic shapes are off in this process (empty: they are on).
std::string dynamic_shapes_off_reason() {
  if (const char* setting = std::getenv("FLASHCHECK_CUDNN_DYNAMIC"); setting && std::string_view(setting) == "0")
    return "FLASHCHECK_CUDNN_DYNAMIC=0";
#if CUDNN_VERSION < 90500
  return fmt::format("built against cuDNN {}; a kernel cache bound to an operation graph needs 9.5", CUDNN_VERSION);
#else
  if (cudnnGetVersion() < 90500)
    return fmt::format("cuDNN {} at run time; a kernel cache bound to an operation graph needs 9.5", cudnnGetVersion());
  return {};
#endif
}

class CudnnSdpa final : public gpu::GpuSubject {
 public:
  CudnnSdpa() = default;
  /// A subject whose kernel caches and plan files live in `cache_dir` ("" for none).
  explicit CudnnSdpa(std::string cache_dir) : cache_dir_(std::move(cache_dir)) {}
  /// cudnn-fp8 (kFp8Capabilities), with the same cache folder as `cudnn`.
  struct Fp8 {};
  explicit CudnnSdpa(Fp8) : fp8_(true) {
    dynamic_off_ = "fp8 graphs are built per geometry";
    dynamic_off_backward_ = dynamic_off_;
  }
  std::string_view name() const override { return fp8_ ? "cudnn-fp8" : "cudnn"; }
  std::string_view description() const override {
    return fp8_ ? "cuDNN's fp8 SDPA forward (sdpa_fp8, e4m3/e5m2, O in fp8 widened to bf16) through the cuDNN frontend"
                : "cuDNN fused attention (SDPA) through the cuDNN frontend graph API";
  }
  const Capabilities& capabilities() const override { return fp8_ ? kFp8Capabilities : kCapabilities; }
  std::string version_info() const override {
    return fmt::format("cuDNN {} (built against {}), cudnn-frontend {}, {}", cudnnGetVersion(), CUDNN_VERSION,
                       CUDNN_FRONTEND_VERSION,
                       dynamic_off_.empty() ? "dynamic shapes with a kernel cache per topology"
                                            : "per-geometry graphs (" + dynamic_off_ + ")") +
           fmt::format("; backward: sdpa_backward, deterministic algorithm, {}",
                       dynamic_off_backward_.empty() ? "a kernel cache per topology where cuDNN takes dynamic shapes"
                                                     : "per-geometry graphs (" + dynamic_off_backward_ + ")");
  }
  std::string stats() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    const GraphCounters& c = counters_;
    if (c.launches == 0 && c.refusals == 0) return {};
    const auto percent = [](std::int64_t part, std::int64_t whole) {
      return whole > 0 ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole))
                       : std::string("n/a");
    };
    const auto mean = [](double ms, std::int64_t count) {
      return count > 0 ? fmt::format("{:.1f} ms", ms / static_cast<double>(count)) : std::string("-");
    };
    const std::int64_t dynamic_builds = c.cold_builds + c.warm_builds;
    std::string line = fmt::format(
        "cudnn graphs: {} launch(es), {} reused a cached geometry's graph ({}); graphs built: {} with dynamic shapes "
        "({} first of their topology ({} topolog{} met), mean {}; {} later geometr{} of a known topology, mean {}: "
        "kernel-cache hit rate "
        "{}), {} per-geometry (mean {}); fallbacks: {} at build, {} at execute; {} refused",
        c.launches, c.graph_hits, percent(c.graph_hits, c.launches), dynamic_builds, c.cold_builds,
        topologies_.size(), topologies_.size() == 1 ? "y" : "ies", mean(c.cold_ms, c.cold_builds), c.warm_builds,
        c.warm_builds == 1 ? "y" : "ies", mean(c.warm_ms, c.warm_builds), percent(c.warm_builds, dynamic_builds),
        c.static_builds, mean(c.static_ms, c.static_builds), c.build_fallbacks, c.execute_fallbacks, c.refusals);
    // cuDNN before 9.27 cannot say whether a build bound a cached kernel: the
    // rate counts builds of a topology whose kernel is cached, and the two mean
    // build times are the evidence. From 9.27 the cache's revision counter
    // (unchanged by a lookup, moved by an insertion) checks each one.
    if (c.revision_checked > 0)
      line += fmt::format("; by the cache's revision counter {} of {} warm builds compiled nothing", c.revision_hits,
                          c.revision_checked);
    else if (c.warm_builds > 0)
      line += "; (cuDNN < 9.27 does not report hits: compare the two mean build times)";
    if (!cache_dir_.empty())
      line += fmt::format("; kernel-cache files in {}: {} read, {} written, {} first build(s) on a cache read from a file",
                          cache_dir_, c.files_read, c.files_written, c.file_builds);
    if (!cache_dir_.empty())
      line += fmt::format("; plan files: {} read (mean {}) instead of compiled, {} written, {} rejected", c.plans_read,
                          mean(c.plans_read_ms, c.plans_read), c.plans_written, c.plans_rejected);
    if (!dynamic_off_.empty()) line += "; dynamic shapes off: " + dynamic_off_;
    if (!dynamic_off_backward_.empty() && dynamic_off_backward_ != dynamic_off_)
      line += "; dynamic shapes off for the backward: " + dynamic_off_backward_;
    for (const std::string& reason : c.fallback_reasons) line += "; note: " + reason;
    return line;
  }
  ~CudnnSdpa() override {
    if (handle_ && !gpu::context_poisoned()) cudnnDestroy(handle_);
  }

 private:
  // The geometry: everything a graph is built from.
  // A backward geometry ends in " bwd" (a forward one as before, so that
  // plan files written before the backward are still found).
  static std::string key(const Problem& p, const gpu::AttentionArgs& a) {
    return fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}{}", p.batch, p.heads_q, p.heads_kv,
                       p.seqlen_q, p.seqlen_kv, p.head_dim, p.head_dim_v, static_cast<int>(p.dtype),
                       static_cast<int>(p.layout), static_cast<int>(p.mask), p.window_left, p.window_right, p.padded(),
                       p.softmax_scale, a.q_seq_stride, a.k_seq_stride, a.o_seq_stride,
                       p.pass == Pass::bwd ? " bwd" : "") +
           (p.page_size > 0 ? fmt::format(" page={} pages={} per_sequence={}", p.page_size, a.pages,
                                          a.pages_per_sequence)
                            : std::string());
  }

  // The topology: what the geometries that may share a compiled kernel have in
  // common, the nodes of the graph and their compile-time attributes. Batch,
  // heads (so GQA), sequence lengths and strides (so the layout) are the
  // dynamic shapes; the scale, the window bounds and the lengths a mask reads
  // are pass-by-value scalars of the graph. A right bound of 0 adds no node
  // (the plain causal band), so it is a topology of its own. A backward
  // topology's name starts with "bwd ".
  static std::string topology_key(const Problem& p) {
    return fmt::format("{}dtype={} d={} dv={} mask={} left={} right={} padded={}", p.pass == Pass::bwd ? "bwd " : "",
                       to_string(p.dtype), p.head_dim,
                       p.head_dim_v, to_string(p.mask), p.window_left >= 0,
                       p.window_right < 0 ? "none" : (p.window_right == 0 ? "zero" : "set"), p.padded()) +
           (p.page_size > 0 ? " paged" : "");
  }

  // The folder of this cuDNN, frontend and GPU's files ("" without a cache folder).
  std::filesystem::path version_folder() const {
    if (cache_dir_.empty()) return {};
    return std::filesystem::path(cache_dir_) /
           fmt::format("cudnn{}-fe{}-sm{}", cudnnGetVersion(), CUDNN_FRONTEND_VERSION, gpu::device_compute_capability());
  }

  // The file of a topology's kernel cache ("" without a cache folder).
  std::filesystem::path cache_file(const std::string& topology) const {
    if (cache_dir_.empty()) return {};
    std::string name = topology;
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
    return version_folder() / (name + ".json");
  }

  // The file of a geometry's serialized plan ("" without a cache folder):
  // named by the geometry's FNV-1a hash (stable across processes and builds,
  // unlike std::hash).
  std::filesystem::path plan_file(const std::string& geometry) const {
    if (cache_dir_.empty()) return {};
    std::uint64_t hash = 14695981039346656037ull;
    for (unsigned char c : geometry) hash = (hash ^ c) * 1099511628211ull;
    return version_folder() / "plans" / fmt::format("{:016x}.plan", hash);
  }

  // Writes `bytes` to `file` through a temporary file and a rename, so that a
  // concurrent reader never sees half a file. Returns the error, if any.
  static std::error_code write_atomically(const std::filesystem::path& file, std::string_view bytes) {
    std::error_code error;
    std::filesystem::create_directories(file.parent_path(), error);
    if (error) return error;
    const std::filesystem::path temporary = file.string() + fmt::format(".{}.tmp", static_cast<long>(getpid()));
    {
      std::ofstream stream(temporary, std::ios::binary | std::ios::trunc);
      stream.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      if (!stream.flush()) error = std::make_error_code(std::errc::io_error);
    }
    if (!error) std::filesystem::rename(temporary, file, error);
    if (error) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
    }
    return error;
  }

  // The plain graph of a geometry from its plan file: std::nullopt where
  // there is none, it belongs to another geometry, or cuDNN will not load it.
  std::optional<CachedGraph> read_plan(const std::string& geometry) {
    const std::filesystem::path file = plan_file(geometry);
    std::error_code ignored;
    if (file.empty() || !std::filesystem::exists(file, ignored)) return std::nullopt;
    const auto start = Clock::now();
    std::ifstream stream(file, std::ios::binary);
    std::string header;
    std::getline(stream, header);
    if (!stream || header != geometry) return std::nullopt;  // a hash collision (or a torn file): a miss
    const std::vector<std::uint8_t> blob{std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
    CachedGraph cached{std::make_shared<fe::graph::Graph>(), 0, false};
    fe::error_t status;
    try {
      status = cached.graph->deserialize(handle_, blob);
      if (status.is_good()) status = cached.graph->get_workspace_size(cached.workspace_bytes);
    } catch (const std::exception& thrown) {  // a blob the JSON parser rejects
      status = {fe::error_code_t::INVALID_VALUE, thrown.what()};
    }
    if (!status.is_good()) {
      ++counters_.plans_rejected;
      note_fallback(fmt::format("plan file {} not loaded ({}): rebuilt", file.string(), status.get_message()));
      return std::nullopt;
    }
    ++counters_.plans_read;
    counters_.plans_read_ms += ms_since(start);
    return cached;
  }

  // Writes a plain graph's built plan to its geometry's plan file.
  void write_plan(const std::string& geometry, const CachedGraph& cached) {
    const std::filesystem::path file = plan_file(geometry);
    if (file.empty()) return;
    std::vector<std::uint8_t> blob;
    if (fe::error_t status = cached.graph->serialize(blob, false); !status.is_good()) {
      note_fallback(fmt::format("plan not serialized: {}", status.get_message()));
      return;
    }
    std::string bytes = geometry + "\n";
    bytes.append(blob.begin(), blob.end());
    if (const std::error_code error = write_atomically(file, bytes)) {
      note_fallback(fmt::format("plan file {} not written: {}", file.string(), error.message()));
      return;
    }
    ++counters_.plans_written;
  }

  // A new topology's kernel cache: read from its file when there is one.
  void open_topology(const std::string& key, Topology& topology) {
    const std::filesystem::path file = cache_file(key);
    std::error_code ignored;
    if (file.empty() || !std::filesystem::exists(file, ignored)) return;
    std::ifstream stream(file, std::ios::binary);
    std::ostringstream text;
    text << stream.rdbuf();
    auto read = std::make_shared<fe::KernelCache>();
    if (fe::error_t status = stream ? read->from_json(text.str()) : fe::error_t{fe::error_code_t::INVALID_VALUE, "unreadable"};
        !status.is_good()) {
      note_fallback(fmt::format("[{}] kernel-cache file {} not read: {}", key, file.string(), status.get_message()));
      return;
    }
    topology.kernel_cache = read;
    topology.from_file = true;
    ++counters_.files_read;
  }

  // Writes a topology's kernel cache to its file (after its first build, which compiled).
  void save_topology(const std::string& key, const Topology& topology) {
    const std::filesystem::path file = cache_file(key);
    if (file.empty()) return;
    std::string json;
    if (fe::error_t status = topology.kernel_cache->to_json(json); !status.is_good()) {
      note_fallback(fmt::format("[{}] kernel cache not written: {}", key, status.get_message()));
      return;
    }
    if (const std::error_code error = write_atomically(file, json)) {
      note_fallback(fmt::format("[{}] kernel cache not written to {}: {}", key, file.string(), error.message()));
      return;
    }
    ++counters_.files_written;
  }

  void note_fallback(std::string reason) {
    constexpr std::size_t kReasonsKept = 4;
    auto& reasons = counters_.fallback_reasons;
    if (reasons.size() < kReasonsKept && std::find(reasons.begin(), reasons.end(), reason) == reasons.end())
      reasons.push_back(std::move(reason));
  }

  // Builds the graph of one geometry: with dynamic shapes and `kernel_cache`
  // when it is set, a plain graph otherwise. Never throws.
  BuildOutcome try_build(const Problem& p, const gpu::AttentionArgs& a,
                         const std::shared_ptr<fe::KernelCache>& kernel_cache) {
    if (kernel_cache && injected_build_failures > 0) {
      --injected_build_failures;
      return {std::nullopt, "cuDNN refused (injected by cudnn_testing::fail_dynamic_path)"};
    }
    try {
      auto graph = std::make_shared<fe::graph::Graph>();
      const auto io = p.dtype == DType::e4m3   ? fe::DataType_t::FP8_E4M3
                      : p.dtype == DType::e5m2 ? fe::DataType_t::FP8_E5M2
                      : p.dtype == DType::bf16 ? fe::DataType_t::BFLOAT16
                                               : fe::DataType_t::HALF;
      graph->set_io_data_type(io).set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(
          fe::DataType_t::FLOAT);
      // Before any node: the SDPA node picks its implementation from the context.
      if (kernel_cache) graph->set_dynamic_shape_enabled(true).set_kernel_cache(kernel_cache);
      auto tensor = [&](const char* name, Uid uid, std::int64_t heads, std::int64_t seq, std::int64_t dim,
                        std::int64_t batch_stride, std::int64_t head_stride, std::int64_t seq_stride) {
        return graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_dim({p.batch, heads, seq, dim})
                                 .set_stride({batch_stride, head_stride, seq_stride, 1}));
      };
      auto q = tensor("Q", kQ, p.heads_q, p.seqlen_q, p.head_dim, a.q_batch_stride, a.q_head_stride, a.q_seq_stride);
      // Paged K/V are containers of pages: [pages, heads_kv, page_size, d].
      const bool paged = p.page_size > 0;
      const std::int64_t kv_batch = paged ? a.pages : p.batch, kv_rows = paged ? p.page_size : p.seqlen_kv;
      auto container = [&](const char* name, Uid uid, std::int64_t dim, std::int64_t batch_stride,
                           std::int64_t head_stride, std::int64_t seq_stride) {
        return graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_dim({kv_batch, p.heads_kv, kv_rows, dim})
                                 .set_stride({batch_stride, head_stride, seq_stride, 1}));
      };
      auto k = container("K", kK, p.head_dim, a.k_batch_stride, a.k_head_stride, a.k_seq_stride);
      auto v = container("V", kV, p.head_dim_v, a.v_batch_stride, a.v_head_stride, a.v_seq_stride);
      // The masks and lengths, the same attributes on both passes' nodes.
      const auto set_masks = [&](auto& attributes) {
        if (p.mask == MaskKind::causal_tl) attributes.set_causal_mask(true);
        if (p.mask == MaskKind::causal_br) attributes.set_causal_mask_bottom_right(true);
        if (p.mask == MaskKind::window) {
          attributes.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT);
          if (p.window_left >= 0) attributes.set_diagonal_band_left_bound(static_cast<int>(p.window_left) + 1);
          if (p.window_right >= 0) attributes.set_diagonal_band_right_bound(static_cast<int>(p.window_right));
        }
        if (p.padded() || paged) {  // a paged cache needs the lengths (the frontend's rule)
          auto lengths = [&](const char* name, Uid uid) {
            return graph->tensor(fe::graph::Tensor_attributes()
                                     .set_name(name)
                                     .set_uid(uid)
                                     .set_dim({p.batch, 1, 1, 1})
                                     .set_stride({1, 1, 1, 1})
                                     .set_data_type(fe::DataType_t::INT32));
          };
          attributes.set_padding_mask(true).set_seq_len_q(lengths("seq_q", kSeqQ)).set_seq_len_kv(
              lengths("seq_kv", kSeqKv));
        }
        if constexpr (std::is_same_v<std::decay_t<decltype(attributes)>, fe::graph::SDPA_attributes>) {
          if (paged) {
            // One table for K and V: [batch, 1, pages a sequence, 1] INT32.
            auto table = [&](const char* name, Uid uid) {
              return graph->tensor(fe::graph::Tensor_attributes()
                                       .set_name(name)
                                       .set_uid(uid)
                                       .set_dim({p.batch, 1, a.pages_per_sequence, 1})
                                       .set_stride({a.pages_per_sequence, a.pages_per_sequence, 1, 1})
                                       .set_data_type(fe::DataType_t::INT32));
            };
            attributes.set_paged_attention_k_table(table("page_table_k", kPageTableK))
                .set_paged_attention_v_table(table("page_table_v", kPageTableV))
                .set_paged_attention_max_seq_len_kv(static_cast<int>(p.seqlen_kv));
          }
        }
      };
      // LSE (cuDNN's Stats): [batch, heads_q, seqlen_q, 1] f32, packed.
      const std::vector<std::int64_t> stats_dim = {p.batch, p.heads_q, p.seqlen_q, 1};
      const std::vector<std::int64_t> stats_stride = {p.heads_q * p.seqlen_q, p.seqlen_q, 1, 1};
      if (p.pass == Pass::bwd) {
        // O, dO and dQ, dK, dV in the strides of O, O and Q, K, V.
        auto o = tensor("O", kO, p.heads_q, p.seqlen_q, p.head_dim_v, a.o_batch_stride, a.o_head_stride,
                        a.o_seq_stride);
        auto dout = tensor("dO", kdO, p.heads_q, p.seqlen_q, p.head_dim_v, a.o_batch_stride, a.o_head_stride,
                           a.o_seq_stride);
        auto stats = graph->tensor(fe::graph::Tensor_attributes()
                                       .set_name("Stats")
                                       .set_uid(kStats)
                                       .set_dim(stats_dim)
                                       .set_stride(stats_stride)
                                       .set_data_type(fe::DataType_t::FLOAT));
        auto attributes = fe::graph::SDPA_backward_attributes()
                              .set_name("flashcheck_sdpa_backward")
                              .set_attn_scale(static_cast<float>(p.softmax_scale))
                              .set_deterministic_algorithm(true);
        set_masks(attributes);
        auto [dq, dk, dv] = graph->sdpa_backward(q, k, v, o, dout, stats, attributes);
        dq->set_output(true).set_uid(kdQ).set_dim({p.batch, p.heads_q, p.seqlen_q, p.head_dim}).set_stride(
            {a.q_batch_stride, a.q_head_stride, a.q_seq_stride, 1});
        dk->set_output(true).set_uid(kdK).set_dim({p.batch, p.heads_kv, p.seqlen_kv, p.head_dim}).set_stride(
            {a.k_batch_stride, a.k_head_stride, a.k_seq_stride, 1});
        dv->set_output(true).set_uid(kdV).set_dim({p.batch, p.heads_kv, p.seqlen_kv, p.head_dim_v}).set_stride(
            {a.v_batch_stride, a.v_head_stride, a.v_seq_stride, 1});
      } else if (is_fp8(p.dtype)) {
        // O = (P x scale_s in fp8) V x descale_s descale_v scale_o, with
        // S = Q K^T descale_q descale_k attn_scale: the scales are device scalars.
        auto scalar = [&](const char* name, Uid uid) {
          return graph->tensor(fe::graph::Tensor_attributes()
                                   .set_name(name)
                                   .set_uid(uid)
                                   .set_dim({1, 1, 1, 1})
                                   .set_stride({1, 1, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        };
        auto attributes = fe::graph::SDPA_fp8_attributes()
                              .set_name("flashcheck_sdpa_fp8")
                              .set_generate_stats(true)
                              .set_attn_scale(static_cast<float>(p.softmax_scale));
        set_masks(attributes);
        auto [o, stats, amax_s, amax_o] =
            graph->sdpa_fp8(q, k, v, scalar("descale_q", kDescaleQ), scalar("descale_k", kDescaleK),
                            scalar("descale_v", kDescaleV), scalar("descale_s", kDescaleS),
                            scalar("scale_s", kScaleS), scalar("scale_o", kScaleO), attributes);
        o->set_output(true).set_uid(kO).set_dim({p.batch, p.heads_q, p.seqlen_q, p.head_dim_v}).set_stride(
            {a.o_batch_stride, a.o_head_stride, a.o_seq_stride, 1}).set_data_type(io);
        stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim).set_stride(
            stats_stride);
        for (auto [amax, uid] : {std::pair{amax_s, kAmaxS}, std::pair{amax_o, kAmaxO}})
          amax->set_output(true).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(
              fe::DataType_t::FLOAT);
      } else {
        auto attributes = fe::graph::SDPA_attributes()
                              .set_name("flashcheck_sdpa")
                              .set_generate_stats(true)
                              .set_attn_scale(static_cast<float>(p.softmax_scale));
        set_masks(attributes);
        auto [o, stats] = graph->sdpa(q, k, v, attributes);
        o->set_output(true).set_uid(kO).set_dim({p.batch, p.heads_q, p.seqlen_q, p.head_dim_v}).set_stride(
            {a.o_batch_stride, a.o_head_stride, a.o_seq_stride, 1});
        stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim).set_stride(
            stats_stride);
      }

      const char* step = nullptr;
      fe::error_t status;
      const auto failed = [&](fe::error_t result, const char* name) {
        if (result.is_good()) return false;
        status = result;
        step = name;
        return true;
      };
      CachedGraph cached{graph, 0, kernel_cache != nullptr};
      if (failed(graph->validate(), "validate") ||
          failed(graph->build_operation_graph(handle_), "build_operation_graph") ||
          failed(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") ||
          failed(graph->check_support(handle_), "check_support") || failed(graph->build_plans(handle_), "build_plans") ||
          failed(graph->get_workspace_size(cached.workspace_bytes), "get_workspace_size"))
        return {std::nullopt, fmt::format("cuDNN refused ({}): {}", step, status.get_message())};
      return {cached, {}};
    } catch (const std::exception& thrown) {
      // The frontend throws where no SDPA implementation fits the attributes.
      return {std::nullopt, fmt::format("cuDNN refused (the frontend threw): {}", thrown.what())};
    }
  }

  // The plain graph of a geometry: from its plan file when there is one,
  // else built (and its plan written to the file).
  BuildOutcome build_static(const Problem& p, const gpu::AttentionArgs& a) {
    const std::string geometry = key(p, a);
    if (std::optional<CachedGraph> read = read_plan(geometry)) return {read, {}};
    const auto start = Clock::now();
    BuildOutcome outcome = try_build(p, a, nullptr);
    if (outcome.built) {
      ++counters_.static_builds;
      counters_.static_ms += ms_since(start);
      write_plan(geometry, *outcome.built);
    }
    return outcome;
  }

  // Why dynamic shapes are off for a pass's graphs (empty: they are on).
  std::string& dynamic_off(Pass pass) { return pass == Pass::bwd ? dynamic_off_backward_ : dynamic_off_; }

  // Whether a topology of the pass has built a graph with dynamic shapes.
  bool any_dynamic_build(Pass pass) const {
    return std::any_of(topologies_.begin(), topologies_.end(), [pass](const auto& entry) {
      return entry.second.dynamic_builds > 0 && entry.first.starts_with("bwd ") == (pass == Pass::bwd);
    });
  }

  // The graph of a new geometry. Throws gpu::Unsupported where the plain graph
  // is refused (whatever the dynamic one did).
  CachedGraph build(const Problem& p, const gpu::AttentionArgs& a) {
    Topology* topology = nullptr;
    const std::string topology_name = topology_key(p);
    if (dynamic_off(p.pass).empty()) {
      const auto [entry, added] = topologies_.try_emplace(topology_name);
      if (added) open_topology(topology_name, entry->second);
      topology = entry->second.static_only.empty() ? &entry->second : nullptr;
    }
    if (topology) {
      const bool warm = topology->dynamic_builds > 0 || topology->from_file;
      std::int64_t revision_before = -1;
      if (warm && !topology->kernel_cache->revision(revision_before).is_good()) revision_before = -1;
      auto start = Clock::now();
      BuildOutcome dynamic = try_build(p, a, topology->kernel_cache);
      if (!dynamic.built && topology->from_file && topology->dynamic_builds == 0) {
        // The cache read from a file may be what failed: try once more with a fresh one.
        note_fallback(fmt::format("[{}] a kernel cache read from a file failed ({}); built with a fresh one",
                                  topology_name, dynamic.refusal));
        topology->kernel_cache = std::make_shared<fe::KernelCache>();
        topology->from_file = false;
        start = Clock::now();
        dynamic = try_build(p, a, topology->kernel_cache);
      }
      const double elapsed_ms = ms_since(start);
      if (dynamic.built) {
        const bool fresh = topology->dynamic_builds == 0 && !topology->from_file;
        if (topology->dynamic_builds == 0 && topology->from_file) ++counters_.file_builds;
        ++topology->dynamic_builds;
        if (!fresh) {
          ++counters_.warm_builds;
          counters_.warm_ms += elapsed_ms;
          std::int64_t revision_after = -1;
          if (revision_before >= 0 && topology->kernel_cache->revision(revision_after).is_good()) {
            ++counters_.revision_checked;
            if (revision_after == revision_before) ++counters_.revision_hits;
          }
        } else {
          ++counters_.cold_builds;
          counters_.cold_ms += elapsed_ms;
          save_topology(topology_name, *topology);
        }
        return *dynamic.built;
      }
      BuildOutcome plain = build_static(p, a);
      if (!plain.built) {
        ++counters_.refusals;
        throw gpu::Unsupported(plain.refusal);
      }
      ++counters_.build_fallbacks;
      note_fallback(fmt::format("[{}] dynamic shapes: {}", topology_name, dynamic.refusal));
      // A topology that never built with dynamic shapes is not tried again.
      if (topology->dynamic_builds == 0) topology->static_only = dynamic.refusal;
      // An engine set without dynamic-shape support ("No valid engine configs";
      // cuDNN 9.14's SDPA engines: "This engine currently does not support
      // dynamic shape") refuses every topology, and each refusal cost ~0.6 s
      // on an H100 (Gpu_cudnn's gpu-quick run: 89 builds, mean 696 ms): where
      // none of its pass has built with dynamic shapes yet, they are off for
      // that pass in the process (the forward's and the backward's engines
      // are not the same).
      if (!any_dynamic_build(p.pass) && dynamic.refusal.find("No valid engine configs") != std::string::npos)
        dynamic_off(p.pass) = fmt::format("cuDNN {} has no SDPA engine for dynamic shapes here ({})", cudnnGetVersion(),
                                   dynamic.refusal.substr(0, 120));
      return *plain.built;
    }
    BuildOutcome plain = build_static(p, a);
    if (!plain.built) {
      ++counters_.refusals;
      throw gpu::Unsupported(plain.refusal);
    }
    return *plain.built;
  }

  // The backward's tensors: the forward's pack with O and Stats as inputs,
  // and dO, dQ, dK, dV.
  std::unordered_map<std::int64_t, void*> backward_pack(const Problem& p, const gpu::AttentionArgs& a,
                                                        const void* dout, void* dq, void* dk, void* dv) const {
    std::unordered_map<std::int64_t, void*> pack = variant_pack(p, a);
    pack[kdO] = const_cast<void*>(dout);
    pack[kdQ] = dq;
    pack[kdK] = dk;
    pack[kdV] = dv;
    return pack;
  }

  std::unordered_map<std::int64_t, void*> variant_pack(const Problem& p, const gpu::AttentionArgs& a) const {
    std::unordered_map<std::int64_t, void*> pack = {{kQ, const_cast<void*>(a.q)},
                                                    {kK, const_cast<void*>(a.k)},
                                                    {kV, const_cast<void*>(a.v)},
                                                    {kO, a.o},
                                                    {kStats, a.lse}};
    if (p.padded() || p.page_size > 0) {
      pack[kSeqQ] = const_cast<std::int32_t*>(a.lens_q);
      pack[kSeqKv] = const_cast<std::int32_t*>(a.lens_kv);
    }
    if (p.page_size > 0) {
      pack[kPageTableK] = const_cast<std::int32_t*>(a.page_table);
      pack[kPageTableV] = const_cast<std::int32_t*>(a.page_table);
    }
    return pack;
  }

  fe::error_t execute(const CachedGraph& cached, std::unordered_map<std::int64_t, void*>& pack,
                      const gpu::CallSite& site) {
    const auto needed_bytes = static_cast<std::size_t>(cached.workspace_bytes);
    if (workspace_.bytes() < needed_bytes) {
      workspace_ = gpu::DeviceBuffer();  // the smaller one freed first
      // A workspace the device cannot hold (the deterministic backward's is
      // b * hq * sq * skv * 2 bytes on Hopper) is a refusal with its size, not
      // a failed allocation.
      std::size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && needed_bytes > free_bytes)
        throw gpu::Unsupported(fmt::format("cuDNN's graph needs a workspace of {:.2f} GiB; the device has {:.2f} GiB "
                                           "free of {:.2f} GiB",
                                           static_cast<double>(needed_bytes) / (1 << 30),
                                           static_cast<double>(free_bytes) / (1 << 30),
                                           static_cast<double>(total_bytes) / (1 << 30)));
      workspace_ = gpu::DeviceBuffer(needed_bytes, site);
    }
    return cached.graph->execute(handle_, pack, workspace_.get());
  }

  void launch(const Problem& p, const gpu::AttentionArgs& a, const gpu::CallSite& site) override {
    if (p.seqlen_q == 0 || p.seqlen_kv == 0)
      throw gpu::Unsupported("cuDNN SDPA takes no empty sequence dimension");
    // The forward's graph whatever pass the problem names (a pass=bwd
    // problem's forward is the same call).
    Problem forward = p;
    forward.pass = Pass::fwd;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!is_fp8(p.dtype)) {
      run_graph(forward, a, variant_pack(forward, a), site);
      return;
    }
    // fp8: O in fp8 at V's descale (scale_o = 1 / descale_v), then widened
    // to the bf16 O the problem takes, except in timed launches (timing()).
    const std::size_t o_bytes = static_cast<std::size_t>(p.o_elements());
    if (fp8_o_.bytes() < o_bytes) fp8_o_ = gpu::DeviceBuffer(o_bytes, site);
    const std::array<float, 8> scales = {a.q_descale, a.k_descale, a.v_descale, 1.0f / kFp8ScaleS,
                                         kFp8ScaleS,  1.0f / a.v_descale, 0.0f, 0.0f};
    if (fp8_scales_.bytes() == 0) fp8_scales_ = gpu::DeviceBuffer(sizeof scales, site);
    if (scales != uploaded_scales_) {  // the same inputs' launches (a timing) upload them once
      gpu::check(cudaMemcpyAsync(fp8_scales_.get(), scales.data(), sizeof scales, cudaMemcpyHostToDevice, a.stream),
                 "cudaMemcpyAsync (fp8 scales)", site);
      gpu::check(cudaStreamSynchronize(a.stream), "cudaStreamSynchronize (fp8 scales)", site);
      uploaded_scales_ = scales;
    }
    std::unordered_map<std::int64_t, void*> pack = variant_pack(forward, a);
    pack[kO] = fp8_o_.get();
    auto* scalar = static_cast<float*>(fp8_scales_.get());
    for (const Uid uid : {kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO})
      pack[uid] = scalar + (uid - kDescaleQ);
    run_graph(forward, a, std::move(pack), site);
    if (!timing())
      gpu::check(cudnn_fp8::widen_to_bf16(fp8_o_.get(), a.o, p.o_elements(), p.dtype == DType::e5m2, a.v_descale,
                                          a.stream),
                 "widen_to_bf16 (cudnn-fp8's O)", site);
  }

  // The backward (pass=bwd): sdpa_backward on the handed Q, K, V, O, Stats
  // and dO; GpuSubject::run_backward checks it as it checks the forward.
  void launch_backward(const Problem& p, const gpu::BackwardArgs& args, const gpu::CallSite& site) override {
    const gpu::AttentionArgs& a = args.attention;
    if (p.seqlen_q == 0 || p.seqlen_kv == 0)
      throw gpu::Unsupported("cuDNN SDPA takes no empty sequence dimension");
    std::lock_guard<std::mutex> lock(mutex_);
    run_graph(p, a, backward_pack(p, a, args.dout, args.dq, args.dk, args.dv), site);
  }
  // cuDNN writes no padding row of dQ, dK or dV: they are set to 0 after the call.
  gpu::BackwardNeeds backward_needs() const override { return {/*dq_accumulator=*/false, /*writes_padding_rows=*/false}; }
  // Stats: the handed LSE, +inf where a row sees no key (the file's header says why).
  std::vector<float> backward_lse(const std::vector<float>& handed) const override {
    std::vector<float> stats = handed;
    if (!stats_as_given)
      for (float& lse : stats)
        if (lse == -std::numeric_limits<float>::infinity()) lse = std::numeric_limits<float>::infinity();
    return stats;
  }

  // Runs the graph of a geometry (either pass; built, or read from its plan
  // file, on first use) on a.stream with the tensors of `pack`. The caller
  // holds mutex_.
  void run_graph(const Problem& p, const gpu::AttentionArgs& a, std::unordered_map<std::int64_t, void*> pack,
                 const gpu::CallSite& site) {
    if (!handle_) {
      const cudnnStatus_t created = cudnnCreate(&handle_);
      if (created != CUDNN_STATUS_SUCCESS)
        throw gpu::Unsupported(fmt::format("cudnnCreate failed: {}", cudnnGetErrorString(created)));
    }
    if (const cudnnStatus_t bound = cudnnSetStream(handle_, a.stream); bound != CUDNN_STATUS_SUCCESS)
      throw gpu::CudaError(cudaErrorUnknown,
                           fmt::format("cudnnSetStream failed: {} on problem '{}'", cudnnGetErrorString(bound),
                                       site.problem),
                           false);
    ++counters_.launches;
    const std::string graph_key = key(p, a);
    auto found = cache_.find(graph_key);
    if (found != cache_.end()) ++counters_.graph_hits;
    else found = cache_.emplace(graph_key, build(p, a)).first;
    fe::error_t status;
    if (found->second.dynamic && injected_execute_failures > 0) {
      --injected_execute_failures;
      status = {fe::error_code_t::GRAPH_EXECUTION_FAILED, "injected by cudnn_testing::fail_dynamic_path"};
    } else {
      status = execute(found->second, pack, site);
    }
    if (!status.is_good() && found->second.dynamic) {
      // A failed execute of a dynamic-shape plan: unless it left the context
      // unusable, run the plain graph of this geometry instead (it writes
      // every output again), and keep the topology on plain graphs.
      const cudaError_t pending = cudaPeekAtLastError();
      if (gpu::is_sticky(pending)) gpu::check(pending, "cuDNN execute (dynamic shapes)", site);
      cudaGetLastError();
      const std::string failure = status.get_message();
      ++counters_.execute_fallbacks;
      note_fallback(fmt::format("[{}] dynamic-shape execute failed: {}", topology_key(p), failure));
      if (auto topology = topologies_.find(topology_key(p));
          topology != topologies_.end() && topology->second.static_only.empty())
        topology->second.static_only = "execute failed: " + failure;
      BuildOutcome plain = build_static(p, a);
      if (!plain.built) {
        cache_.erase(found);
        ++counters_.refusals;
        throw gpu::Unsupported(fmt::format("{} (after the dynamic-shape graph's execute failed: {})", plain.refusal,
                                           failure));
      }
      found->second = *plain.built;
      status = execute(found->second, pack, site);
    }
    if (!status.is_good())
      throw gpu::CudaError(cudaErrorUnknown,
                           fmt::format("cuDNN execute failed: {} on problem '{}'", status.get_message(), site.problem),
                           false);
    gpu::check_launch("cudnn sdpa", site);
  }

  std::string dynamic_off_ = dynamic_shapes_off_reason();  // set for the process when cuDNN refuses them outright
  std::string dynamic_off_backward_ = dynamic_off_;          // the same, for the backward's graphs
  const std::string cache_dir_ = [] {
    const char* folder = std::getenv("FLASHCHECK_CUDNN_CACHE_DIR");
    return std::string(folder ? folder : "");
  }();
  mutable std::mutex mutex_;
  cudnnHandle_t handle_ = nullptr;
  std::map<std::string, CachedGraph> cache_;          // by geometry
  std::map<std::string, Topology> topologies_;        // by topology_key
  GraphCounters counters_;
  gpu::DeviceBuffer workspace_;
  bool fp8_ = false;                     // cudnn-fp8
  gpu::DeviceBuffer fp8_o_, fp8_scales_;  // its fp8 O, and its scales and amaxes (Uid order from kDescaleQ)
  std::array<float, 8> uploaded_scales_{};
};

SubjectRegistration<CudnnSdpa> registration;
const struct Fp8Registration {
  Fp8Registration() {
    Registry::instance().add([] { return std::make_unique<CudnnSdpa>(CudnnSdpa::Fp8{}); }, Registry::Kind::subject);
  }
} fp8_registration;

}  // namespace

std::unique_ptr<Subject> cudnn_testing::make_subject(const std::string& cache_dir) {
  return std::make_unique<CudnnSdpa>(cache_dir);
}

void cudnn_testing::hand_stats_as_given(bool as_given) { stats_as_given = as_given; }

void cudnn_testing::fail_dynamic_path(int builds, int executes) {
  injected_build_failures = builds;
  injected_execute_failures = executes;
}
}  // namespace flashcheck
