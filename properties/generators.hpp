// RapidCheck generators for flashcheck's vocabulary.
//
// gen_problem(limits) draws problems over the whole vocabulary, weighted toward
// the edges (empty and length-1 sequences, GQA/MQA, every mask, windows of 0 and
// wider than the sequence, padded batches with empty sequences). showValue
// prints a Problem as its replayable one-line form.
#pragma once

#include <rapidcheck.h>

#include <ostream>

#include "core/problem.hpp"

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
};

rc::Gen<Problem> gen_problem(const ProblemLimits& limits);
rc::Gen<ValueDist> gen_value_dist(bool allow_special_values);
/// Sequence lengths weighted toward 0, 1, 2 and small primes.
rc::Gen<std::int64_t> gen_seqlen(std::int64_t max);

}  // namespace flashcheck

namespace rc {
template <>
struct Arbitrary<flashcheck::Problem> {
  static Gen<flashcheck::Problem> arbitrary() { return flashcheck::gen_problem({}); }
};
}  // namespace rc

namespace flashcheck {
/// RapidCheck prints counterexamples through this: the replayable line.
inline void showValue(const Problem& problem, std::ostream& os) { os << "'" << to_line(problem) << "'"; }
}  // namespace flashcheck
