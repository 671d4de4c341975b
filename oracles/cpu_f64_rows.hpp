// cpu_f64's reading of the Problem, shared by its forward (cpu_f64.cpp) and
// its backward (cpu_f64_backward.cpp): the keys a query row sees, and the row
// blocks its products run on. Private to oracles/ (kernels keep their own
// reading of the masks, and cpu_lowp its own, so that a shared bug cannot hide).
#pragma once

#include <algorithm>
#include <cmath>
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

// The score modifications of a problem (Problem::softcap, Problem::alibi) on
// one query head, cpu_f64's own reading of the convention: s <- C tanh(s / C),
// then s <- s - slope_h |i + (lk - lq) - j|.
struct ScoreModification {
  double softcap = 0;  // 0: none
  double slope = 0;    // 0: no ALiBi
  std::int64_t shift = 0;  // lk - lq: the bottom-right aligned diagonal

  ScoreModification(const Problem& p, std::int64_t h, std::int64_t lq, std::int64_t lk)
      : softcap(p.softcap), shift(lk - lq) {
    if (!p.alibi) return;
    // The standard slopes (Press et al.): m the largest power of two <= heads.
    std::int64_t m = 1;
    while (2 * m <= p.heads_q) m *= 2;
    const double step = h < m ? static_cast<double>(h + 1) * 8.0 : static_cast<double>(2 * (h - m) + 1) * 4.0;
    slope = std::pow(2.0, -step / static_cast<double>(m));
  }
  bool active() const { return softcap > 0 || slope != 0; }
  // |ALiBi's bias| of (i, j): 0 without ALiBi.
  double bias_magnitude(std::int64_t i, std::int64_t j) const {
    return slope * std::fabs(static_cast<double>(i + shift - j));
  }
  double operator()(double s, std::int64_t i, std::int64_t j) const {
    if (softcap > 0) s = softcap * std::tanh(s / softcap);
    return s - bias_magnitude(i, j);
  }
  // d(modified)/d(scaled logit): 1 - tanh^2(s / C) with a softcap, else 1.
  double derivative(double s) const {
    if (!(softcap > 0)) return 1.0;
    const double t = std::tanh(s / softcap);
    return 1.0 - t * t;
  }
};

// Row blocks keep each thread's score block near this size: 256 rows x 4096
// keys. Measured on the 2-core EPYC (B=1, H=2..4, N=M=4096, d=128): 2, 4 and
// 8 MiB blocks gave 61.3, 62.0 and 64.2 GFLOP/s; larger blocks amortize BLAS's
// packing of K over more rows, which outweighs keeping the block in L2.
inline constexpr std::int64_t kScoreBlockBytes = 8 << 20;

inline std::int64_t rows_per_block(std::int64_t keys) {
  return std::clamp<std::int64_t>(kScoreBlockBytes / (8 * std::max<std::int64_t>(keys, 1)), 16, 256);
}

}  // namespace flashcheck::cpu_f64_detail
