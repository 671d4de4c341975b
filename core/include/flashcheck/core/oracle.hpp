// Oracles: references that compute attention for a set of query rows in f64.
#pragma once

#include <string_view>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/core/tensor.hpp"

namespace flashcheck {

class Oracle {
 public:
  virtual ~Oracle() = default;
  virtual std::string_view name() const = 0;
  /// O and LSE of the given rows, in f64. Fully masked rows give O = 0 and
  /// LSE = -inf; rows past a sequence's valid length are padding (left 0 / -inf).
  virtual AttentionRows reference(const Problem& problem, const Inputs& inputs, const RowSet& rows) = 0;
};

}  // namespace flashcheck
