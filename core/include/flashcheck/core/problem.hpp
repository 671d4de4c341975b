// One attention call: geometry, types, mask, value distribution and seeds.
//
// A Problem prints as one line (to_line) that parse_problem reads back to an
// equal Problem, so every failure flashcheck reports can be replayed from its
// printed form with `flashcheck run --problem '<line>'`.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flashcheck/core/dtype.hpp"

namespace flashcheck {

/// Memory order of the Q/K/V/O tensors: [batch, heads, seq, dim] or [batch, seq, heads, dim].
enum class Layout : std::uint8_t { bhsd, bshd };

/// Which keys a query row may attend to. With Lq valid queries and Lk valid
/// keys in a sequence, query i may see key j when:
///   none       always
///   causal_tl  j <= i                       (diagonal at the top-left corner)
///   causal_br  j <= i + (Lk - Lq)           (diagonal at the bottom-right corner)
///   window     i + (Lk - Lq) - left <= j <= i + (Lk - Lq) + right
///              (bottom-right aligned, as FlashAttention's window_size;
///               a negative bound means unbounded on that side)
/// A row that may see no key is "fully masked": O = 0 and LSE = -inf.
enum class MaskKind : std::uint8_t { none, causal_tl, causal_br, window };

/// The family of input values. Parameters are family-specific; see values.hpp.
enum class ValueFamily : std::uint8_t {
  normal,         // normal(mean, std)
  uniform,        // uniform(lo, hi)
  heavy,          // heavy(nu): Student-t with nu degrees of freedom
  outliers,       // outliers(p, scale): N(0,1) + N(0,scale^2)*Bernoulli(p), LLM-style
  sparse_int,     // sparse_int(max, density): integers in [-max, max], exact in every dtype
  near_overflow,  // near_overflow(logit_std, v_frac): huge logits, |V| near the dtype's max
  subnormal,      // subnormal(): every input in the dtype's subnormal range
  ties,           // ties(distinct): K rows drawn from few distinct rows -> exact score ties
  dominant,       // dominant(gap): one key per (batch, head) wins every row by `gap` logits
  late_max,       // late_max(tile, gap): the row maximum arrives only in the last key tile
  nan_inf,        // nan_inf(p): normal(0.5,1) with NaN/+Inf/-Inf injected at rate p
  offset,         // offset(logit): every logit moved by `logit` (e.g. -6e4, below a -5e4 mask sentinel)
};

std::string_view to_string(ValueFamily family);
std::optional<ValueFamily> parse_value_family(std::string_view text);
/// Number of parameters the family takes, and their defaults.
std::vector<double> default_params(ValueFamily family);

struct ValueDist {
  ValueFamily family = ValueFamily::normal;
  std::vector<double> params = {0.5, 1.0};
  bool operator==(const ValueDist&) const = default;
};

std::string to_string(const ValueDist& dist);

/// Which pass a problem runs. fwd: Q, K, V -> O, LSE. bwd: the gradients
/// dQ, dK, dV of the forward for an upstream gradient dO (drawn from
/// Problem::dout); the subject is handed O and LSE as backward_outputs in
/// core/backward.hpp defines them.
enum class Pass : std::uint8_t { fwd, bwd };
std::string_view to_string(Pass pass);

std::string_view to_string(Layout layout);
std::string_view to_string(MaskKind mask);

struct Problem {
  std::int64_t batch = 1;
  std::int64_t heads_q = 1;
  std::int64_t heads_kv = 1;       // < heads_q for GQA, 1 for MQA
  std::int64_t seqlen_q = 1;       // padded (maximum) lengths
  std::int64_t seqlen_kv = 1;
  std::vector<std::int64_t> lens_q;   // optional per-sequence lengths (size batch)
  std::vector<std::int64_t> lens_kv;  // optional per-sequence lengths (size batch)
  std::int64_t head_dim = 64;
  std::int64_t head_dim_v = 64;
  /// The inputs' storage dtype. dtype=e4m3 / e5m2: Q, K and V stored in fp8,
  /// each with its per-tensor descale factor (HostTensor::descale, a power of
  /// two drawn from the values: values.hpp), O written in bf16
  /// (output_dtype); the forward only.
  DType dtype = DType::bf16;
  Layout layout = Layout::bhsd;
  MaskKind mask = MaskKind::none;
  std::int64_t window_left = -1;   // only with MaskKind::window; -1 = unbounded
  std::int64_t window_right = -1;
  double softmax_scale = 0.125;
  /// The score modifications of the serving vocabulary, in FlashAttention-2's
  /// order. With s_ij = softmax_scale q_i . k_j:
  ///   softcap=C (C > 0; 0: none)  s_ij <- C tanh(s_ij / C)   (after the scale)
  ///   alibi=yes                   s_ij <- s_ij - slope_h |i + (Lk - Lq) - j|
  /// then the mask. ALiBi is bottom-right aligned as the masks are (the
  /// convention of FlashAttention's alibi_slopes); slope_h is the standard
  /// ALiBi slope of query head h of heads_q heads (Press et al.): with m the
  /// largest power of two <= heads_q, 2^(-8 (h + 1) / m) for h < m, and
  /// 2^(-4 (2 (h - m) + 1) / m) for the rest (alibi_slope below). Each oracle
  /// and subject computes them with its own code.
  double softcap = 0;
  bool alibi = false;
  /// page=P (P >= 1; 0: contiguous K/V): K and V live in a paged pool of
  /// P-key pages, as serving stacks keep their KV caches, and a page table
  /// maps each sequence's n-th page to a pool page (Inputs::pages,
  /// paging.hpp): key j of sequence b is slot j % P of pool page
  /// table[b][j / P]. The table is drawn from the geometry seed, shuffled,
  /// with spare pages and with prefix pages shared between sequences. The
  /// forward only: a backward problem (pass=bwd) takes contiguous K/V.
  std::int64_t page_size = 0;
  ValueDist values;
  Pass pass = Pass::fwd;
  /// dO's values (pass=bwd only): the families of `values`, drawn as V's are
  /// (the structural families that shape Q and K give dO their normal part).
  ValueDist dout{ValueFamily::normal, {0.0, 1.0}};
  std::uint64_t geometry_seed = 0;
  std::uint64_t data_seed = 0;

  bool operator==(const Problem&) const = default;

  /// Valid query/key count of sequence b (the per-sequence length, or the padded one).
  std::int64_t len_q(std::int64_t b) const { return lens_q.empty() ? seqlen_q : lens_q[b]; }
  std::int64_t len_kv(std::int64_t b) const { return lens_kv.empty() ? seqlen_kv : lens_kv[b]; }
  bool padded() const { return !lens_q.empty() || !lens_kv.empty(); }
  /// Query heads per K/V head.
  std::int64_t group_size() const { return heads_q / heads_kv; }
  /// Elements of each tensor (padded shapes).
  std::int64_t q_elements() const { return batch * heads_q * seqlen_q * head_dim; }
  std::int64_t k_elements() const { return batch * heads_kv * seqlen_kv * head_dim; }
  std::int64_t v_elements() const { return batch * heads_kv * seqlen_kv * head_dim_v; }
  std::int64_t o_elements() const { return batch * heads_q * seqlen_q * head_dim_v; }
  std::int64_t lse_elements() const { return batch * heads_q * seqlen_q; }
  /// Host bytes of inputs and outputs as stored (the floor of what one case needs).
  double storage_bytes() const;
};

/// The keys [first, last] that valid query row i of sequence b may see under
/// the mask (the rule above, written once for the host side of the harness;
/// the oracles keep their own). Empty (last < first) for a fully masked row.
struct VisibleKeys {
  std::int64_t first = 0, last = -1;
  std::int64_t count() const { return last >= first ? last - first + 1 : 0; }
};
VisibleKeys visible_key_range(const Problem& problem, std::int64_t b, std::int64_t i);
/// (query, key) pairs the mask lets through, over every batch entry and query head.
double visible_pairs(const Problem& problem);
/// Query rows (over every batch entry and query head) that see at least one
/// key: the rows a case can compare. 0 makes a case vacuous.
std::int64_t visible_rows(const Problem& problem);
/// The FLOP count of a call, defined once for every report: the forward's two
/// products, 2 d + 2 dv FLOPs per visible (query, key) pair (4 B Hq N M d
/// without a mask); a backward (pass=bwd) counts 2.5 times that, the
/// convention of flash-attention's and cuDNN's benchmarks (five products
/// against the forward's two: S = Q K^T recomputed, dV = P^T dO, dP = dO V^T,
/// dQ = dS K, dK = dS^T Q), whatever a kernel actually recomputes.
double attention_flops(const Problem& problem);
/// Bytes a call moves at least, every tensor once: the forward reads Q, K, V
/// and writes O and LSE (storage_bytes); the backward reads Q, K, V, O, dO
/// and LSE and writes dQ, dK and dV.
double attention_bytes(const Problem& problem);
/// The backward's FLOPs over the forward's (attention_flops).
inline constexpr double kBackwardFlopsFactor = 2.5;

/// The standard ALiBi slope of query head h of `heads` (Problem::alibi):
/// the harness's reading, for generators and reports (the oracles keep their own).
double alibi_slope(std::int64_t heads, std::int64_t h);

/// 1/sqrt(head_dim), the usual softmax scale.
double default_softmax_scale(std::int64_t head_dim);

/// A problem with the usual defaults for everything but its geometry.
Problem make_problem(std::int64_t batch, std::int64_t heads_q, std::int64_t heads_kv, std::int64_t seqlen_q,
                     std::int64_t seqlen_kv, std::int64_t head_dim, DType dtype, MaskKind mask = MaskKind::none);

/// Bad input: names the field and the reason, in one line:
///   "bad problem: FIELD: REASON", or with a location (a file and line)
///   "LOCATION: bad problem: FIELD: REASON", the location first.
/// Text quoted from the input goes through printable_excerpt, so the message
/// holds no control byte (a NUL cannot cut it short) and stays short.
class BadInput : public std::runtime_error {
 public:
  BadInput(std::string field, const std::string& reason, std::string location = {});
  const std::string& field() const { return field_; }
  const std::string& reason() const { return reason_; }
  const std::string& location() const { return location_; }

 private:
  std::string field_;
  std::string reason_;
  std::string location_;
};

/// Most characters of an input token that an error message quotes.
inline constexpr std::size_t kMaxQuotedChars = 80;

/// `text` as an error message may quote it: bytes outside printable ASCII
/// written as \xNN, and at most kMaxQuotedChars characters, a longer token cut
/// and marked with how many bytes were left out.
std::string printable_excerpt(std::string_view text);

/// The one-line form, e.g.
///   b=2 hq=8 hkv=2 sq=128 skv=256 d=64 dv=64 dtype=bf16 layout=bhsd mask=causal_br
///   scale=0.125 values=normal(0.5,1) gseed=1 dseed=7
/// plus `lens_q=..`, `lens_kv=..` for padded batches, `window=L,R` for window
/// masks, and `pass=bwd dout=normal(0,1)` for a backward problem (a forward
/// line names no pass: lines written before the backward pass read the same).
std::string to_line(const Problem& problem);

/// Parses and validates a line. Optional keys: hkv (= hq), dv (= d), layout
/// (bhsd), mask (none), scale (1/sqrt(d)), values (normal(0.5,1)), pass (fwd),
/// dout (normal(0,1), with pass=bwd only), gseed, dseed (0). Throws BadInput naming the field on any error.
Problem parse_problem(std::string_view line);

/// Checks the invariants (sizes, GQA divisibility, lengths, window only with the
/// window mask, value parameters that become integers, memory). Throws BadInput
/// naming the field; a problem whose estimated_memory_bytes exceeds
/// memory_limit_bytes is refused (field "size") with the estimate and the limit.
void validate(const Problem& problem);

/// Host bytes one judged case of the problem holds at once (oracles/judge.cpp),
/// estimated from its shape alone (nothing is allocated): Q, K, V as stored;
/// O and LSE of two runs (subject, peer); and, in f64, the compared query rows
/// of O and LSE five times (the reference with its condition numbers, the
/// baseline's rows, the rows gathered from the subject and the peer), counting
/// the judge's default of up to 1024 rows per sequence (more with
/// `run --rows`, or `--every-row`).
double estimated_memory_bytes(const Problem& problem);

/// Bytes of physical memory of this host (0 if unknown).
double physical_memory_bytes();

/// The most memory (bytes) a problem may need (estimated_memory_bytes) to be
/// accepted. Default: half of physical_memory_bytes(); the environment
/// variable FLASHCHECK_MAX_MEMORY (GiB) replaces the default, so that child
/// processes (sweep workers) inherit a limit the CLI's --max-memory set.
/// 0 means no limit (physical memory unknown and nothing set).
double memory_limit_bytes();
/// Sets the limit for this process (bytes > 0, finite); throws BadInput
/// (field "max-memory") otherwise.
void set_memory_limit_bytes(double bytes);
/// Forgets a limit set_memory_limit_bytes set: back to the default.
void clear_memory_limit();

}  // namespace flashcheck
