#include "flashcheck/testing/relations.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

namespace flashcheck::testing {

KeyShift shift_keys(const Problem& p, const Inputs& in, const AttentionRows& rows, const std::vector<double>& w) {
  KeyShift out{rows, 0.0};
  AttentionRows& moved = out.rows;
  const bool with_condition = !moved.o_condition.empty();
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size();
      std::vector<double> v_max(static_cast<std::size_t>(p.head_dim_v), 0.0);
      for (std::int64_t j = 0; j < p.len_kv(b); ++j)
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) v_max[c] = std::max(v_max[c], std::fabs(in.v.get(b, hk, j, c)));
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        double dot = 0, abs_dot = 0;
        for (std::int64_t c = 0; c < p.head_dim; ++c) {
          dot += in.q.get(b, h, i, c) * w[c];
          abs_dot += std::fabs(in.q.get(b, h, i, c) * w[c]);
        }
        const double shift = p.softmax_scale * dot, growth = p.softmax_scale * abs_dot;
        out.largest_shift = std::max(out.largest_shift, std::fabs(shift));
        const auto row = moved.index(b, h, i);
        if (!std::isfinite(rows.lse[row])) continue;  // fully masked: stays -inf
        moved.lse[row] += shift;
        if (!with_condition) continue;
        moved.lse_condition[row] += growth;
        for (std::int64_t c = 0; c < p.head_dim_v; ++c)
          moved.o_condition[row * p.head_dim_v + c] += growth * (v_max[c] + std::fabs(moved.o_row(b, h, i)[c]));
      }
    }
  return out;
}

AttentionRows map_values(const Problem& p, const AttentionRows& rows, double a, double shift) {
  AttentionRows out = rows;
  const bool with_condition = !out.o_condition.empty();
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.len_q(b); ++i) {
        if (visible_key_range(p, b, i).count() == 0) continue;  // fully masked: stays 0
        const auto row = out.index(b, h, i);
        double* o = out.o_row(b, h, i);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          o[c] = a * o[c] + shift;
          if (!with_condition) continue;
          double& condition = out.o_condition[row * p.head_dim_v + c];
          condition = std::fabs(a) * condition + 2 * std::fabs(shift) * out.lse_condition[row];
        }
      }
  return out;
}

Merged merge_by_lse(const Problem& p, const AttentionRows& ra, const AttentionRows& rb) {
  Merged out{AttentionRows(p, all_rows(p)), 0.0};
  AttentionRows& merged = out.rows;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t i = 0; i < p.seqlen_q; ++i) {
        const double la = ra.lse[ra.index(b, h, i)], lb = rb.lse[rb.index(b, h, i)];
        const double top = std::max(la, lb);
        const double lse = top + std::log(std::exp(la - top) + std::exp(lb - top));
        const double wa = std::exp(la - lse), wb = std::exp(lb - lse);
        merged.lse[merged.index(b, h, i)] = lse;
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          const double oa = ra.o_row(b, h, i)[c], ob = rb.o_row(b, h, i)[c];
          merged.o_row(b, h, i)[c] = wa * oa + wb * ob;
          out.weight_sensitivity = std::max(out.weight_sensitivity, wa * wb * std::fabs(oa - ob));
        }
      }
  return out;
}

Interval value_hull(const Problem& p, const HostTensor& v, DType work, bool may_flush_subnormals,
                    double rounding_units) {
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  Interval out{AttentionRows(p, all_rows(p)), AttentionRows(p, all_rows(p))};
  std::fill(out.hi.lse.begin(), out.hi.lse.end(), kInfinity);  // LSE unbounded: [-inf, +inf]
  std::vector<double> row_lo, row_hi, key_lo, key_hi;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    std::vector<VisibleKeys> ranges;
    for (std::int64_t i = 0; i < lq; ++i) ranges.push_back(visible_key_range(p, b, i));
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
        // The hull of V as the subject sees it: rounded to the dtype it
        // computes in, and, where it may flush subnormals, with them as 0 too.
        key_lo.assign(static_cast<std::size_t>(lk), 0.0);
        key_hi.assign(static_cast<std::size_t>(lk), 0.0);
        for (std::int64_t j = 0; j < lk; ++j) {
          // fp8 V is in its format already (stored value x descale; round_to would
          // round the descaled value to the unscaled grid).
          const double x = is_fp8(work) ? v.get(b, hk, j, c) : round_to(work, v.get(b, hk, j, c));
          const double flushed = may_flush_subnormals && std::fabs(x) < min_normal(work) ? 0.0 : x;
          key_lo[j] = std::min(x, flushed);
          key_hi[j] = std::max(x, flushed);
        }
        // Both ends of a row's key range move forward with the row under every
        // mask, so one pass with monotone deques gives each row's min and max.
        row_lo.assign(static_cast<std::size_t>(lq), 0.0);
        row_hi.assign(static_cast<std::size_t>(lq), 0.0);
        std::deque<std::int64_t> lows, highs;  // key indices, values increasing / decreasing
        std::int64_t next = 0;
        for (std::int64_t i = 0; i < lq; ++i) {
          const VisibleKeys range = ranges[i];
          if (range.count() == 0) continue;  // sees no key: exactly 0
          for (; next <= range.last; ++next) {
            while (!lows.empty() && key_lo[lows.back()] >= key_lo[next]) lows.pop_back();
            while (!highs.empty() && key_hi[highs.back()] <= key_hi[next]) highs.pop_back();
            lows.push_back(next);
            highs.push_back(next);
          }
          while (lows.front() < range.first) lows.pop_front();
          while (highs.front() < range.first) highs.pop_front();
          const double lo = key_lo[lows.front()], hi = key_hi[highs.front()];
          const double slack =
              static_cast<double>(range.count() + 2) * rounding_units * std::max(std::fabs(lo), std::fabs(hi));
          row_lo[i] = lo - slack;
          row_hi[i] = hi + slack;
        }
        for (std::int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
          for (std::int64_t i = 0; i < lq; ++i) {
            out.lo.o_row(b, h, i)[c] = row_lo[i];
            out.hi.o_row(b, h, i)[c] = row_hi[i];
          }
      }
  }
  return out;
}

AttentionRows fully_masked(const Problem& p) { return AttentionRows(p, all_rows(p)); }

}  // namespace flashcheck::testing
