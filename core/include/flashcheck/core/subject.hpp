// Subjects (anything under test) and the capability domain each declares.
//
// A subject declares what it accepts in a constexpr Capabilities next to its
// launcher; generators draw inside that domain, and a call outside it returns
// Status::unsupported without running.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

/// A constexpr set of enum values (bit per value).
template <typename Enum>
class EnumSet {
 public:
  constexpr EnumSet() = default;
  constexpr EnumSet(std::initializer_list<Enum> values) {
    for (Enum value : values) bits_ |= bit(value);
  }
  constexpr bool contains(Enum value) const { return bits_ & bit(value); }
  constexpr void insert(Enum value) { bits_ |= bit(value); }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr bool operator==(const EnumSet&) const = default;

 private:
  static constexpr std::uint32_t bit(Enum value) { return 1u << static_cast<unsigned>(value); }
  std::uint32_t bits_ = 0;
};

/// The domain of a subject.
struct Capabilities {
  EnumSet<DType> dtypes;
  /// Accepted head dims: the listed ones (0 ends the list) or, when the list is
  /// empty, every value in [min_head_dim, max_head_dim].
  std::array<std::int16_t, 8> head_dims{};
  std::int64_t min_head_dim = 1;
  std::int64_t max_head_dim = 576;
  std::int64_t max_head_dim_v = 512;
  bool head_dim_v_equal = false;  // dv must equal d
  EnumSet<MaskKind> masks;
  EnumSet<Layout> layouts{Layout::bhsd, Layout::bshd};
  bool gqa = false;     // heads_kv < heads_q
  bool varlen = false;  // per-sequence lengths
  bool softcap = false;  // Problem::softcap (in every pass the subject runs)
  bool alibi = false;    // Problem::alibi (in every pass the subject runs)
  /// Paged K/V (Problem::page_size, the forward only): the smallest page
  /// size taken and the multiple page sizes must be (0: contiguous K/V only).
  std::int64_t min_page_size = 0;
  std::int64_t page_size_multiple = 1;
  bool page_size_power_of_two = false;  // page sizes must be powers of two (cuDNN's block size)
  bool lse = false;     // writes LSE
  /// The unit of the subject's S = Q K^T accumulation, per k32 step, where it
  /// is coarser than f32's (0: f32). Hopper's fp8 wgmma keeps about 13-14
  /// fraction bits while it accumulates (DeepSeek-V3 technical report,
  /// section 3.3.2: "around 14 bits" retained on the H800): measured on an
  /// H100 (2026-11-27), hopper-fp8's LSE sat 2^-13 to 2^-11.5 of the logits'
  /// condition a_j from the f64 oracle while its O matched the baseline's
  /// (docs/perf.md, "fp8 on Hopper"). The tolerance adds ceil(d / 32) such
  /// units of a_j to O's logit noise and d to LSE's (tolerance.hpp,
  /// lse_logit_noise; LogitCondition::product_unit).
  double product_accumulation_unit = 0;
  /// fp8 problems: the subject rounds O to the inputs' fp8 format (at V's
  /// descale: O / descale_v in the format, then times it, exactly in bf16)
  /// before writing it, as cuDNN's fp8 SDPA must on sm_90 (its bf16 O needs
  /// sm_100). The judge's baseline then rounds its O the same way
  /// (cpu_lowp.hpp: round_o_to_fp8), so the rule compares like with like.
  bool fp8_output = false;
  /// fp8 problems: the most keys a row may see before O leaves the rule
  /// (0: no such limit), a declared limit (a failure beyond it is a
  /// deviation). A subject that carries O across key tiles in the fp8 tensor
  /// cores' accumulator adds each product aligned to the accumulator with
  /// about 13 fraction bits: once a row's sum is 2^13 times a product, the
  /// products stop counting. Measured on an H100 (2026-11-27): cudnn-fp8 O
  /// 0.67 off at 131072 keys; hopper-fp8 before it promoted O per tile, 1.3
  /// off at 32768 (docs/perf.md).
  std::int64_t fp8_accumulator_keys = 0;
  std::int64_t seqlen_q_multiple = 1;
  std::int64_t seqlen_kv_multiple = 1;
  std::int64_t max_seqlen_q = std::numeric_limits<std::int32_t>::max();
  std::int64_t min_seqlen_q = 0;  // the padded seqlen_q's least (cuDNN's fp8 SDPA on sm_90 refuses 1)
  std::int64_t max_seqlen_kv = std::numeric_limits<std::int32_t>::max();
  bool empty_sequences = true;  // seqlen 0 and per-sequence length 0 accepted
  /// Whether NaN/Inf inputs are in the domain. A kernel that multiplies masked
  /// keys' values by a zero weight (an unfused GEMM) turns 0 * Inf into NaN; it
  /// declares nonfinite_inputs = false rather than failing the census.
  bool nonfinite_inputs = true;
  /// Whether the subject may flush subnormal inputs to zero (cuDNN does in
  /// some configurations and not in others): inputs of the `subnormal` value
  /// family are then outside its domain, and the convex-hull property allows
  /// both the flushed and the unflushed hull.
  bool may_flush_subnormals = false;
  /// The subject's tile sizes: not constraints, but where generators put the
  /// edge cases (lengths at tile - 1, tile, tile + 1; maxima in the last tile).
  std::int64_t tile_q = 64;
  std::int64_t tile_kv = 64;
  /// Needs a CUDA device; the minimum compute capability (major*10+minor).
  /// Where either is missing, a run returns Status::unavailable (this machine
  /// cannot run it), never unsupported, and its tests are skipped.
  bool needs_gpu = false;
  int min_compute_capability = 0;
  /// The precision the subject really computes in, when it differs from the
  /// storage dtype (a kernel that takes f32 but computes in f16). The
  /// same-precision baseline of the tolerance rule uses this dtype.
  std::optional<DType> compute_dtype;
  /// The subject splits the keys over blocks and merges the splits through
  /// their LSE, and Subject::set_split_count chooses how many splits.
  bool split_kv = false;
  /// A declared limit: the largest magnitude the subject's unnormalised
  /// softmax accumulator (sum_j exp(s_j - m) V_j, in f32 in a one-pass
  /// kernel) holds before it overflows; 0 when none is declared. A case
  /// outside the rule whose values can reach it (max |V| times the keys one
  /// row sees) is a `deviation`, not a `fail`; generators keep |V| below it.
  double accumulator_max = 0;
  /// Bottom-right aligned masks (causal_br, window) need seqlen_q <= seqlen_kv
  /// (the padded lengths): cuDNN refuses the others at launch ("Bottom right
  /// causal mask does not support max_s_q > max_s_kv"; the same for sliding
  /// windows), measured on an H100 with cuDNN 9.14 as ~20% of its drawn cases.
  bool aligned_masks_need_sq_le_skv = false;
  /// A subject that compiles a program per geometry (cuDNN builds a graph for
  /// each shape, mask, scale and dtype: 0.07-0.45 s each on an H100, nearly
  /// every generated case a new one) asks the properties to draw its problems
  /// from a fixed pool of this many, the data drawn anew for each case (0: no
  /// pool). Measured: Gpu_cudnn's properties spent 60 s of a 64 s run
  /// building graphs.
  int geometry_pool = 0;
  /// The backward pass (Problem::pass = bwd): Subject::run_backward computes
  /// dQ, dK and dV, on the same domain as the forward.
  bool backward = false;
  /// The backward is bitwise repeatable: the same inputs give the same bits on
  /// every run (an ordered dQ reduction, not atomics). The determinism
  /// property holds a subject that declares it to every bit; any other subject
  /// to the tolerance.
  bool backward_deterministic = false;
  /// The backward rounds P and dS to the working dtype before the products
  /// dV = P^T dO, dQ = dS K and dK = dS^T Q, as tensor-core kernels must
  /// (FlashAttention-2's and -3's backward, cuDNN's, the mma family's): the
  /// backward rule's floor then counts one rounding of that dtype per term
  /// (GradientCondition::operand_roundoff), which a subject with f32 operands
  /// is not given.
  bool backward_operands_in_dtype = false;
  /// The backward takes seqlen_q = seqlen_kv = 1 (the padded lengths). cuDNN's
  /// sdpa_backward refuses it at validation ("s_q = s_kv = 1 is not
  /// supported", cuDNN 9.14 and 9.19 on an H200), 6 of 13 discarded draws of
  /// its backward properties before it was declared.
  bool backward_single_position = true;
  /// Documented differences from flashcheck's conventions (empty: none).
  std::string_view known_deviations;
  /// A backward subject whose forward (Subject::run) is another registered
  /// subject's kernel, named here (empty: its own). The property suite then
  /// holds it to the backward properties only: its forward's are that
  /// subject's, and running them again proves nothing new.
  std::string_view forward_from;

  bool accepts_head_dim(std::int64_t d) const;
};

/// Why a problem is outside a domain, or nullopt when it is inside.
std::optional<std::string> unsupported_reason(const Capabilities& caps, const Problem& problem);

/// The declared limit (Capabilities::accumulator_max) that a case can reach,
/// in words, or nullopt when none: `max_abs_v` is the largest finite |V| of
/// its inputs. The judge turns a failed case that matches into a deviation.
std::optional<std::string> declared_deviation(const Capabilities& caps, const Problem& problem, double max_abs_v);

/// The largest input magnitude a value distribution can produce where its
/// parameters state one (near_overflow, uniform, offset, dominant, late_max),
/// else nullopt.
std::optional<double> stated_input_magnitude(const Problem& problem);

struct RunResult;
/// The `unsupported` result for a problem outside a domain, or nullopt inside
/// it: the first line of every Subject::run.
std::optional<RunResult> refuse_outside(const Capabilities& caps, const Problem& problem);
struct BackwardResult;
/// The same for Subject::run_backward.
std::optional<BackwardResult> refuse_backward_outside(const Capabilities& caps, const Problem& problem);

/// One line describing a domain, for `flashcheck list`.
std::string describe(const Capabilities& caps);

enum class Status : std::uint8_t {
  ok,           // outputs written
  unsupported,  // outside the domain; nothing ran, outputs untouched
  unavailable,  // cannot run on this machine (no GPU, no driver, too old a compute capability); nothing ran
  fault,        // the device context is poisoned (illegal address, ...)
  error,        // any other failure of the call
};
std::string_view to_string(Status status);

struct RunResult {
  Status status = Status::ok;
  std::string message;
  Outputs outputs;
  double time_ms = std::numeric_limits<double>::quiet_NaN();
};

/// What a backward call returns (Status as RunResult's).
struct BackwardResult {
  Status status = Status::ok;
  std::string message;
  Gradients gradients;
  double time_ms = std::numeric_limits<double>::quiet_NaN();
};

/// Times of repeated calls, as `flashcheck bench` reports them.
struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  std::vector<float> samples_ms;  // in call order
};
/// The median, minimum and maximum of samples (not empty).
Timing summarise(std::vector<float> samples_ms);

/// Anything under test.
class Subject {
 public:
  virtual ~Subject() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  virtual const Capabilities& capabilities() const = 0;
  /// Versions of the libraries behind the subject, for its records (empty: none).
  virtual std::string version_info() const { return {}; }
  /// One line on the subject's own caches since it was created (graphs built,
  /// cache hits...), for people; empty when it has none or nothing ran.
  virtual std::string stats() const { return {}; }
  /// Runs one call. Implementations check the domain first and return
  /// unsupported (without touching anything) outside it, then unavailable
  /// where this machine cannot run them (no GPU, no driver, too old a GPU).
  virtual RunResult run(const Problem& problem, const Inputs& inputs) = 0;
  /// Runs one backward call (Problem::pass = bwd) on what core/backward.hpp
  /// defines; the same order of checks as run(). A subject without a backward
  /// (Capabilities::backward false) is never called: the domain check refuses
  /// the problem first.
  virtual BackwardResult run_backward(const Problem& problem, const BackwardInputs& inputs);
  /// Makes later runs split the keys `splits` ways (0: the subject's own
  /// heuristic). Returns false, changing nothing, where the subject has no such
  /// choice (Capabilities::split_kv is false) or cannot make that many.
  virtual bool set_split_count(int /*splits*/) { return false; }
  /// Seconds a call may take on top of its work, which a watchdog around it
  /// must allow: an external worker's start-up and its own per-case limit
  /// (0 for in-process subjects).
  virtual double startup_seconds() const { return 0; }
  /// Times `repeats` calls after `warmup` ones, cycling through `input_sets`
  /// copies of the inputs, the call alone measured (CUDA events for GPU
  /// subjects, the worker's own clock for external ones); nullopt when the
  /// subject cannot time itself (the CPU subjects). Called only inside the
  /// domain; throws on a failed call.
  virtual std::optional<Timing> time(const Problem& /*problem*/, const Inputs& /*inputs*/, int /*warmup*/,
                                     int /*repeats*/, int /*input_sets*/) {
    return std::nullopt;
  }
  /// The same for the backward (Problem::pass = bwd) on what core/backward.hpp
  /// defines; nullopt where the subject cannot time itself. Called only inside
  /// the backward domain.
  virtual std::optional<Timing> time_backward(const Problem& /*problem*/, const BackwardInputs& /*inputs*/,
                                              int /*warmup*/, int /*repeats*/, int /*input_sets*/) {
    return std::nullopt;
  }
};

/// The process-wide lists of subjects, of mutants (deliberately broken
/// subjects that the test suite must catch), of fixtures (subjects that
/// misbehave on purpose to test the harness itself: never in `all` or
/// `mutants`, found by name only) and of smoke tests (subjects that exercise
/// the pipeline but cannot fail on accuracy, such as the same-precision
/// baseline judged against itself: never in `all`, found by name, listed
/// apart), filled by static registration objects and constructed on first
/// use, in registration order.
class Registry {
 public:
  enum class Kind { subject, mutant, fixture, smoke };
  using Factory = std::function<std::unique_ptr<Subject>()>;

  static Registry& instance();
  void add(Factory factory, Kind kind = Kind::subject);
  /// The subjects under test (mutants excluded).
  const std::vector<Subject*>& subjects() { return materialise(Kind::subject); }
  /// The mutants, in builds that link kernels/mutants.
  const std::vector<Subject*>& mutants() { return materialise(Kind::mutant); }
  /// The harness's test fixtures, in builds that link them (flashcheck-testing).
  const std::vector<Subject*>& fixtures() { return materialise(Kind::fixture); }
  /// The pipeline smoke tests (not subjects under test: not in `all`).
  const std::vector<Subject*>& smoke_tests() { return materialise(Kind::smoke); }
  /// A subject, mutant, fixture or smoke test by name.
  Subject* find(std::string_view name);
  /// Marks a mutant whose flaw is not expected to show on the hardware at
  /// hand, with the reason: the mutant suite still runs it, and reports it
  /// SKIPPED with the reason (never passed) when it survives.
  void mark_unobservable(std::string_view mutant, std::string_view why);
  /// The reason given for a mutant, or empty.
  std::string unobservable(std::string_view mutant) const;

 private:
  struct List {
    std::vector<Factory> factories;
    std::vector<std::unique_ptr<Subject>> owned;
    std::vector<Subject*> view;
  };
  const std::vector<Subject*>& materialise(Kind kind);
  List& list(Kind kind) {
    switch (kind) {
      case Kind::mutant: return mutants_;
      case Kind::fixture: return fixtures_;
      case Kind::smoke: return smoke_;
      default: return subjects_;
    }
  }
  List subjects_, mutants_, fixtures_, smoke_;
  std::vector<std::pair<std::string, std::string>> unobservable_;
};

/// The peer of a problem: the first of `peers` whose domain holds it (the
/// CLI's default list is cudnn, then cudnn-fp8 for the fp8 problems that
/// cudnn's domain leaves out); null when none does.
inline Subject* peer_for(const std::vector<Subject*>& peers, const Problem& problem) {
  for (Subject* peer : peers)
    if (peer && !unsupported_reason(peer->capabilities(), problem)) return peer;
  return nullptr;
}

/// Registers a subject type at static-initialisation time (a smoke test with
/// Registry::Kind::smoke):
///   static SubjectRegistration<CpuPlain> registration;
template <typename SubjectType>
struct SubjectRegistration {
  explicit SubjectRegistration(Registry::Kind kind = Registry::Kind::subject) {
    Registry::instance().add([] { return std::make_unique<SubjectType>(); }, kind);
  }
};

/// Registers a mutant: a factory for one deliberately broken subject.
struct MutantRegistration {
  explicit MutantRegistration(Registry::Factory factory) {
    Registry::instance().add(std::move(factory), Registry::Kind::mutant);
  }
};

/// Registers a fixture: a subject that misbehaves on purpose, for the
/// harness's own tests.
struct FixtureRegistration {
  explicit FixtureRegistration(Registry::Factory factory) {
    Registry::instance().add(std::move(factory), Registry::Kind::fixture);
  }
};

}  // namespace flashcheck
