#include "flashcheck/core/gradients.hpp"

#include <numeric>
#include <utility>

namespace flashcheck {

GradientRows::GradientRows(const Problem& p, RowSet q, RowSet kv)
    : q_rows(std::move(q)),
      kv_rows(std::move(kv)),
      batch(p.batch),
      heads_q(p.heads_q),
      heads_kv(p.heads_kv),
      dim(p.head_dim),
      dim_v(p.head_dim_v),
      dq(static_cast<std::size_t>(p.batch * p.heads_q * q_rows.size() * p.head_dim), 0.0),
      dk(static_cast<std::size_t>(p.batch * p.heads_kv * kv_rows.size() * p.head_dim), 0.0),
      dv(static_cast<std::size_t>(p.batch * p.heads_kv * kv_rows.size() * p.head_dim_v), 0.0) {}

RowSet all_key_rows(const Problem& p) {
  RowSet set;
  set.rows.resize(static_cast<std::size_t>(p.seqlen_kv));
  std::iota(set.rows.begin(), set.rows.end(), std::int64_t{0});
  return set;
}

RowSet sample_key_rows(const Problem& p, std::int64_t count, std::uint64_t seed) {
  // The key axis read as a query axis: the same sampler, over the key lengths.
  Problem keys = p;
  keys.seqlen_q = p.seqlen_kv;
  keys.lens_q = p.lens_kv;
  return sample_rows(keys, count, seed);
}

}  // namespace flashcheck
