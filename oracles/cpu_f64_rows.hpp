// cpu_f64's reading of the Problem, shared by its forward (cpu_f64.cpp) and
// its backward (cpu_f64_backward.cpp): the keys a query row sees, and the row
// blocks its products run on. Private to oracles/ (kernels keep their own
// reading of the masks, and cpu_lowp its own, so that a shared bug cannot hide).
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashcheck/core/problem.hpp"

namespace flashcheck::cpu_f64_detail {

// Keys [first, last] that query i of a sequence with lq queries and lk keys may
// see; empty when first > last. The oracle's own reading of MaskKind's spec.
struct KeyRange {
  std::int64_t first, last;
  bool empty() const { return first > last; }
};

inline KeyRange visible_keys(const Problem& p, std::int64_t i, std::int64_t lq, std::int64_t lk) {
  const std::int64_t diagonal = i + (lk - lq);  // bottom-right aligned diagonal
  KeyRange range{0, lk - 1};
  switch (p.mask) {
    case MaskKind::none: break;
    case MaskKind::causal_tl: range.last = std::min(range.last, i); break;
    case MaskKind::causal_br: range.last = std::min(range.last, diagonal); break;
    case MaskKind::window:
      if (p.window_left >= 0) range.first = std::max(range.first, diagonal - p.window_left);
      if (p.window_right >= 0) range.last = std::min(range.last, diagonal + p.window_right);
      break;
  }
  return range;
}

// Row blocks keep each thread's score block near this size: 256 rows x 4096
// keys. Measured on the 2-core EPYC (B=1, H=2..4, N=M=4096, d=128): 2, 4 and
// 8 MiB blocks gave 61.3, 62.0 and 64.2 GFLOP/s; larger blocks amortize BLAS's
// packing of K over more rows, which outweighs keeping the block in L2.
inline constexpr std::int64_t kScoreBlockBytes = 8 << 20;

inline std::int64_t rows_per_block(std::int64_t keys) {
  return std::clamp<std::int64_t>(kScoreBlockBytes / (8 * std::max<std::int64_t>(keys, 1)), 16, 256);
}

}  // namespace flashcheck::cpu_f64_detail
