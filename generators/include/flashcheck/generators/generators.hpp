// RapidCheck generators for flashcheck's vocabulary.
//
// gen_problem(limits) draws problems over the whole vocabulary, weighted toward
// the edges (empty and length-1 sequences, GQA/MQA, every mask, windows of 0 and
// wider than the sequence, padded batches with empty sequences). showValue
// prints a Problem as its replayable one-line form.
#pragma once

#include <rapidcheck.h>

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/subject.hpp"

namespace flashcheck {

/// Size limits for generated problems (so no property allocates much).
struct ProblemLimits {
  std::int64_t max_batch = 3;
  std::int64_t max_heads_kv = 3;
  std::int64_t max_group = 4;
  std::int64_t max_seqlen = 48;
  std::int64_t max_head_dim = 80;
  bool allow_padding = true;
  bool allow_special_values = true;  // NaN/Inf injection
  bool score_mods = false;           // softcap= and alibi=yes, each in 1 draw of 4
  bool paged = false;                // page=P in 1 draw of 3, P from 1 to past the keys
};

rc::Gen<Problem> gen_problem(const ProblemLimits& limits);
rc::Gen<ValueDist> gen_value_dist(bool allow_special_values);
/// Sequence lengths weighted toward 0, 1, 2 and small primes.
rc::Gen<std::int64_t> gen_seqlen(std::int64_t max);

/// Limits for problems drawn inside a subject's domain: at most `max_work`
/// multiply-adds (B*Hq*Sq*Skv*(d+dv)) and 1 GiB of buffers, so a default
/// property run stays fast and small.
struct DomainLimits {
  std::int64_t max_seqlen = 1025;
  std::int64_t max_head_dim = 256;  // for range domains; listed head dims are always drawn
  double max_work = 2e7;
  double max_bytes = 1 << 30;
  bool allow_special_values = true;
  /// false (the default): only problems with at least one query row that sees
  /// a key (visible_rows(p) > 0), so that every case compares something.
  /// true: only empty or fully masked problems (visible_rows(p) == 0), for the
  /// property that holds those to the fully-masked convention.
  bool vacuous_only = false;
  /// Long contexts at a small rate (about 1 case in 40, where the domain's
  /// max_seqlen_* allow): decode shapes (seqlen_q <= 16) with up to 262144
  /// keys, prefill with up to 32768 queries and keys. They ignore max_seqlen
  /// and max_work (the judge samples their rows: JudgeOptions::max_rows), so
  /// they stay off in the properties' default budget; the fuzz sweep turns
  /// them on.
  bool long_contexts = false;
  /// Draw from the domain's pool of problems where it declares one
  /// (Capabilities::geometry_pool): the properties do, so that a subject that
  /// compiles a program per geometry reuses it; the sweep does not (it draws
  /// every geometry, and pays for the compilation).
  bool use_geometry_pool = true;
  /// Backward problems (pass=bwd, issue 22): dO's family drawn from
  /// gen_dout_values, and head dims of 160 to 256 (where the domain has them)
  /// in 1 case of 4, the range where the peers' backward-only bugs were found
  /// (flash-attention #1306 and #498, TransformerEngine #3216). Everything else
  /// is drawn as for the forward. true: every draw (the backward properties).
  bool backward = false;
  /// With backward false: the share of draws that are backward problems,
  /// where the domain has a backward (Capabilities::backward); the fuzz sweep
  /// draws a third. A backward geometry gets max_work / 2.5 (the backward's
  /// FLOPs) and no long prefill (seqlen_q stays within max_seqlen: the judge
  /// computes the f64 forward on every query row to hand over O and LSE).
  /// Backward problems never draw near_overflow values (gradients past the
  /// dtype's range are not judged).
  double backward_share = 0;
  /// The score modifications (Problem::softcap, Problem::alibi), each in 1
  /// draw of 4 where the domain declares it. Off by default: a property turns
  /// on the ones its relation holds under (ALiBi moves with the positions, so
  /// permutations and key splits do not keep it; a softcap is not additive,
  /// so a key shift does not keep it).
  bool softcap = false;
  bool alibi = false;
  /// A paged K/V cache (Problem::page_size) in 1 forward draw of 3 where the
  /// domain takes one (Capabilities::min_page_size): page sizes from 1 to
  /// 256 keys, the domain's multiples. Off by default: the relations that
  /// move, split or trim K/V rows build contiguous tensors; the properties
  /// that hold under any page table turn it on.
  bool paged = false;
};

/// dO's value families for backward problems: normal(mean, std) mostly,
/// uniform, heavy tails, LLM-style outliers, sparse small integers. Not the
/// families placed at the dtype's range edges (near_overflow, subnormal) nor
/// NaN/Inf: a gradient sums dO over up to every query row, so dO near the
/// dtype's maximum overflows the gradient in the dtype while the f64 oracle
/// stays finite, a limit of the dtype and not of a kernel.
rc::Gen<ValueDist> gen_dout_values();

/// Problems inside `caps`, weighted toward the edges: lengths 0, 1, 2, the
/// tile sizes +-1, primes (97, 113, 1023, 1025), Sq > Skv and Sq < Skv; GQA
/// ratios 1, 2, 4, 8 and MQA; every mask, windows of 0 and wider than the
/// sequence; odd head dims where allowed; padded batches with empty sequences;
/// every value family, with logit gaps at the exp underflow points of
/// f16/bf16/f32, the maximum in the last key tile, logits below -5e4.
rc::Gen<Problem> gen_problem_in(const Capabilities& caps, const DomainLimits& limits = {});

/// Query and K/V head counts (heads_q, heads_kv) inside `caps`, the GQA
/// ratios 1, 2, 4, 8 and MQA drawn evenly (each 1 in 5). With
/// `grouped_only`, only true grouping (heads_kv < heads_q): the ratios 2, 4, 8
/// and MQA, each 1 in 4, for properties about grouping. A domain without GQA
/// gets heads_q == heads_kv (and a discard with `grouped_only`).
rc::Gen<std::pair<std::int64_t, std::int64_t>> gen_grouped_heads(const Capabilities& caps, bool grouped_only = false);

/// Coverage labels of a problem, one per dimension, for RC_CLASSIFY per
/// dimension rather than one cross product:
///   "dtype=bf16", "mask=causal_br", "gqa=1|2|4|8|mqa", "len_q=..", "len_kv=..",
///   "padded=yes|no", "values=<family>", "scale=default|other", "vacuous=yes|no", "pass=fwd|bwd",
///   "mods=none|softcap|alibi|softcap+alibi", "page=none|<16|16+"
/// where a length class is one of 0, 1, tile-1, tile, tile+1, <tile, <4tile,
/// long (>= 4096) or other (tile taken from the domain's tile_q / tile_kv).
/// Usage: for (const auto& label : coverage_labels(p, caps)) RC_TAG(label);
std::vector<std::string> coverage_labels(const Problem& problem, const Capabilities& caps = {});

/// Problems just outside `caps` (one field out of the domain), for the
/// unsupported path. Discards when the domain has no outside.
rc::Gen<Problem> gen_problem_outside(const Capabilities& caps);

/// Value distributions for a storage dtype and the dtype the subject computes
/// in (its range bounds the values), adversarial ones included.
/// near_overflow keeps |V| * seqlen_kv under half of f32's maximum, the range
/// of a one-pass softmax's unnormalised accumulator.
rc::Gen<ValueDist> gen_values_for(DType storage, DType compute, std::int64_t tile_kv, bool allow_special_values,
                                  std::int64_t seqlen_kv = 2048);

/// The problem stored in `dtype` instead, its values of the same magnitudes:
/// near_overflow's parameter, a fraction of the storage dtype's maximum drawn
/// for the dtype it was drawn in, is rescaled to the new one's (a property
/// that moved an f16 draw to f32 had V at half of f32's range, and a
/// textbook f32 kernel's unnormalised sum overflowed: CI, 2026-11-27).
Problem retyped(const Problem& problem, DType dtype);

}  // namespace flashcheck

namespace rc {
template <>
struct Arbitrary<flashcheck::Problem> {
  static Gen<flashcheck::Problem> arbitrary() { return flashcheck::gen_problem({.score_mods = true}); }
};
}  // namespace rc

namespace flashcheck {
/// RapidCheck prints counterexamples through this: the replayable line.
inline void showValue(const Problem& problem, std::ostream& os) { os << "'" << to_line(problem) << "'"; }
}  // namespace flashcheck
