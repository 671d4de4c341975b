// The f64 oracle and the same-precision baselines of a case, kept per
// (problem, inputs), so that a base case judged again costs no second oracle:
// a property's shrinking replays it, and in one process the properties that
// draw the same problems from one seed share their bases (measured, host
// build, cpu-plain, RC_PARAMS=seed=11, all 15 properties in one process:
// 458 hits of 1800 look-ups, 242 entries, 255 MiB; the process's CPU time
// 22.4 s against 23.0 s with FLASHCHECK_REFERENCE_CACHE_MB=0, since the
// cpu-plain subject costs as much as the oracle; its peak RSS 442 MB
// against 125 MB). The Testbed keeps its base cases here, not the baselines
// of transformed inputs, which recur only while a failure shrinks.
//
// Key: the problem's printed line (every field, the seeds included) and a
// 64-bit FNV-1a hash of the three input tensors' dtype, layout, shape and
// storage bytes, to find the entry; a hit is confirmed by comparing the line
// and the inputs bit for bit (HostTensor::operator==), so that a hash
// collision can only cost a miss, never a wrong reference. An entry holds its
// inputs, the f64 reference of every row (with its conditions) and one
// baseline per working dtype. Row sets other than every row are computed and
// not kept.
//
// Bound: the entries' bytes (inputs, reference, baselines) stay under
// capacity_bytes() (default 256 MiB; FLASHCHECK_REFERENCE_CACHE_MB in the
// environment sets the process's cache, 0 keeps nothing), the least recently
// used going first; a result larger than the whole capacity is computed and
// not kept.
#pragma once

#include <cstdint>
#include <memory>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck::testing {

class ReferenceCache final : public ReferenceSource {
 public:
  /// The process's cache (the Testbeds of every property and subject share it).
  static ReferenceCache& instance();

  explicit ReferenceCache(std::int64_t capacity_bytes = std::int64_t{256} << 20);
  ~ReferenceCache() override;
  ReferenceCache(const ReferenceCache&) = delete;
  ReferenceCache& operator=(const ReferenceCache&) = delete;

  /// cpu_f64's reference of `rows` of (problem, inputs), with its conditions.
  /// A copy (the entry may be evicted by the next call).
  AttentionRows reference(const Problem& problem, const Inputs& inputs, const RowSet& rows) override;
  /// cpu_lowp's baseline of `rows` of (problem, inputs), working in `working`.
  AttentionRows baseline(const Problem& problem, const Inputs& inputs, const RowSet& rows, DType working) override;

  struct Stats {
    std::int64_t hits = 0, misses = 0, evictions = 0, entries = 0, bytes = 0;
  };
  Stats stats() const;
  std::int64_t capacity_bytes() const;
  /// Sets the bound (0 keeps nothing) and evicts down to it.
  void set_capacity_bytes(std::int64_t bytes);
  void clear();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace flashcheck::testing
