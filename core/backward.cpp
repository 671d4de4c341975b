#include "flashcheck/core/backward.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace flashcheck {

Gradients make_gradients(const Problem& p) {
  Gradients g{HostTensor(p.dtype, p.layout, p.batch, p.heads_q, p.seqlen_q, p.head_dim),
              HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, p.seqlen_kv, p.head_dim),
              HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, p.seqlen_kv, p.head_dim_v)};
  g.dq.poison();
  g.dk.poison();
  g.dv.poison();
  return g;
}

Outputs backward_outputs(const Problem& p, const AttentionRows& reference) {
  if (reference.rows.size() != p.seqlen_q)
    throw std::invalid_argument("backward_outputs: the reference must hold every query row");
  Outputs out;
  out.o = HostTensor(p.dtype, p.layout, p.batch, p.heads_q, p.seqlen_q, p.head_dim_v);
  out.lse.assign(static_cast<std::size_t>(p.lse_elements()), -std::numeric_limits<float>::infinity());
  out.has_lse = true;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t s = 0; s < p.seqlen_q; ++s) {
        const bool valid = s < p.len_q(b);
        const double* o = reference.o_row(b, h, s);
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) out.o.set(b, h, s, c, valid ? o[c] : 0.0);
        if (valid) out.lse[(b * p.heads_q + h) * p.seqlen_q + s] = static_cast<float>(reference.lse[reference.index(b, h, s)]);
      }
  return out;
}

GradientRows gather_gradients(const Problem& p, const Gradients& g, const RowSet& q_rows, const RowSet& kv_rows) {
  GradientRows out(p, q_rows, kv_rows);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < q_rows.size(); ++r) g.dq.read_row(b, h, q_rows.rows[r], out.dq_row(b, h, r));
    for (std::int64_t h = 0; h < p.heads_kv; ++h)
      for (std::int64_t r = 0; r < kv_rows.size(); ++r) {
        g.dk.read_row(b, h, kv_rows.rows[r], out.dk_row(b, h, r));
        g.dv.read_row(b, h, kv_rows.rows[r], out.dv_row(b, h, r));
      }
  }
  return out;
}

}  // namespace flashcheck
