// The problems the relations need, shared by the forward and backward
// properties (subject_properties.cpp, backward_properties.cpp): a property
// draws a base problem and moves it (unmasked, padded, grouped, trimmed) to
// the problem its relation speaks of. Private to the library.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "flashcheck/core/problem.hpp"
#include "flashcheck/generators/generators.hpp"

namespace flashcheck::testing {
// ---- problems the relations need -----------------------------------------------

// Small integers: exact in every dtype, and after the exact transformations.
inline Problem with_small_integers(Problem p) {
  p.values = ValueDist{ValueFamily::sparse_int, {3.0, 0.5}};
  return p;
}

inline Problem unmasked(Problem p) {
  p.mask = MaskKind::none;
  p.window_left = p.window_right = -1;
  return p;
}

inline Problem unpadded(Problem p) {
  p.lens_q.clear();
  p.lens_kv.clear();
  return p;
}

// Bottom-right causal, unpadded, no window.
inline Problem bottom_right(Problem p) {
  p = unpadded(p);
  p.mask = MaskKind::causal_br;
  p.window_left = p.window_right = -1;
  return p;
}

// Bottom-right causal with Lq <= Lk is top-left causal on Lk queries whose
// last Lq rows are the original queries.
inline Problem top_left_extension(const Problem& br) {
  Problem tl = br;
  tl.mask = MaskKind::causal_tl;
  tl.seqlen_q = br.seqlen_kv;
  return tl;
}

inline Problem repeated_mha(const Problem& gqa) {
  Problem mha = gqa;
  mha.heads_kv = gqa.heads_q;
  return mha;
}

// The single-sequence problem holding batch entry b of a padded problem.
inline Problem trimmed(const Problem& p, std::int64_t b) {
  Problem t = unpadded(p);
  t.batch = 1;
  t.seqlen_q = p.len_q(b);
  t.seqlen_kv = p.len_kv(b);
  return t;
}

// The sub-problem of `count` keys.
inline Problem key_slice(const Problem& p, std::int64_t count) {
  Problem s = p;
  s.seqlen_kv = count;
  return s;
}

// Grouped heads: the drawn grouping, or, for a drawn MHA problem, a ratio of
// 2, 4 or 8 (those within `max_work`, the default work budget unless given),
// or MQA, drawn evenly.
inline rc::Gen<Problem> grouped(const rc::Gen<Problem>& problems, double max_work = DomainLimits{}.max_work) {
  return rc::gen::mapcat(problems, [max_work](Problem p) -> rc::Gen<Problem> {
    if (p.heads_kv < p.heads_q) return rc::gen::just(p);
    const double work_per_head = static_cast<double>(p.batch) * p.heads_kv * p.seqlen_q * p.seqlen_kv *
                                 static_cast<double>(p.head_dim + p.head_dim_v);
    std::vector<std::int64_t> ratios = {0};  // 0: MQA
    for (std::int64_t ratio : {2, 4, 8})
      if (work_per_head * static_cast<double>(ratio) <= max_work) ratios.push_back(ratio);
    return rc::gen::map(rc::gen::elementOf(ratios), [p](std::int64_t ratio) {
      Problem q = p;
      if (ratio == 0) {
        q.heads_kv = 1;
        q.heads_q = std::max<std::int64_t>(p.heads_q, 2);
      } else {
        q.heads_q = p.heads_kv * ratio;
      }
      return q;
    });
  });
}

// Padded batches: the drawn one, or a drawn problem padded with a second,
// shorter sequence.
inline rc::Gen<Problem> padded(const rc::Gen<Problem>& problems) {
  return rc::gen::mapcat(problems, [](Problem p) -> rc::Gen<Problem> {
    if (p.padded()) return rc::gen::just(p);
    return rc::gen::map(rc::gen::pair(rc::gen::inRange<std::int64_t>(0, p.seqlen_q + 1),
                                      rc::gen::inRange<std::int64_t>(0, p.seqlen_kv + 1)),
                        [p](std::pair<std::int64_t, std::int64_t> second) {
                          Problem q = p;
                          q.batch = 2;
                          q.lens_q = {p.seqlen_q, second.first};
                          q.lens_kv = {p.seqlen_kv, second.second};
                          return q;
                        });
  });
}

// The first key position past the last visible key of the visible row that
// ends earliest: keys from there on are unseen by at least that row.
inline std::int64_t earliest_unseen_key(const Problem& p) {
  std::int64_t earliest = p.seqlen_kv;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i)
      if (const VisibleKeys range = visible_key_range(p, b, i); range.count() > 0)
        earliest = std::min(earliest, range.last + 1);
  return earliest;
}

// The (batch, K/V head) pairs whose change leaves another (batch, head) with
// a row that sees a key: with one K/V head, a batch entry other than the only
// one with such rows.
inline std::vector<std::pair<std::int64_t, std::int64_t>> independence_targets(const Problem& p) {
  std::set<std::int64_t> entries_with_rows;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i)
      if (visible_key_range(p, b, i).count() > 0) entries_with_rows.insert(b);
  std::vector<std::pair<std::int64_t, std::int64_t>> targets;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk)
      if (p.heads_kv > 1 || entries_with_rows.size() > 1 || !entries_with_rows.contains(b)) targets.push_back({b, hk});
  return targets;
}

}  // namespace flashcheck::testing
