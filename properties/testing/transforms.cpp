#include "flashcheck/testing/transforms.hpp"

#include <rapidcheck.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace flashcheck::testing {
namespace {

using Shape = std::array<std::int64_t, 4>;

Shape shape_of(const HostTensor& t) { return {t.batch(), t.heads(), t.seqlen(), t.dim()}; }

// A tensor of t's dtype, layout and descale (so that t's values copy exactly).
HostTensor like(const HostTensor& t, const Shape& shape) {
  HostTensor out(t.dtype(), t.layout(), shape[0], shape[1], shape[2], shape[3]);
  out.set_descale(t.descale());
  return out;
}

// Copies `count` elements from element `from` of t on, as stored, to element
// `to` of out on (the same dtype and descale: like() made out), without a
// decode and a rounding back.
void copy_stored(const HostTensor& t, std::int64_t from, HostTensor& out, std::int64_t to, std::int64_t count = 1) {
  const auto bytes = static_cast<std::size_t>(storage_bytes(t.dtype()));
  std::memcpy(static_cast<std::byte*>(out.data()) + static_cast<std::size_t>(to) * bytes,
              static_cast<const std::byte*>(t.data()) + static_cast<std::size_t>(from) * bytes,
              static_cast<std::size_t>(count) * bytes);
}

// out[e] = t[source(e)] for every element e of `out`. Where the source keeps
// the dim index (`along_dim` false: the transform moves whole rows), a row is
// one copy: dim is the innermost axis of both layouts.
template <typename Source>
void gather(const HostTensor& t, HostTensor& out, bool along_dim, Source source) {
  const std::int64_t run = along_dim ? 1 : out.dim();
  Element e;
  for (e.b = 0; e.b < out.batch(); ++e.b)
    for (e.h = 0; e.h < out.heads(); ++e.h)
      for (e.s = 0; e.s < out.seqlen(); ++e.s)
        for (e.c = 0; e.c < out.dim(); e.c += run) {
          const Element from = source(e);
          copy_stored(t, t.offset(from.b, from.h, from.s, from.c), out, out.offset(e.b, e.h, e.s, e.c), run);
        }
}

std::int64_t& index_along(Element& e, Axis axis) {
  switch (axis) {
    case Axis::batch: return e.b;
    case Axis::heads: return e.h;
    case Axis::seq: return e.s;
    case Axis::dim: return e.c;
  }
  return e.c;
}

}  // namespace

std::int64_t extent(const HostTensor& t, Axis axis) { return shape_of(t)[static_cast<std::size_t>(axis)]; }

HostTensor slice(const HostTensor& t, Axis axis, std::int64_t first, std::int64_t count) {
  if (first < 0 || count < 0 || first + count > extent(t, axis)) throw std::out_of_range("slice past the tensor");
  Shape shape = shape_of(t);
  shape[static_cast<std::size_t>(axis)] = count;
  HostTensor out = like(t, shape);
  gather(t, out, axis == Axis::dim, [&](Element e) {
    index_along(e, axis) += first;
    return e;
  });
  return out;
}

HostTensor trim(const HostTensor& t, Axis axis, std::int64_t length) { return slice(t, axis, 0, length); }

HostTensor repeat(const HostTensor& t, Axis axis, std::int64_t times) {
  Shape shape = shape_of(t);
  shape[static_cast<std::size_t>(axis)] *= times;
  HostTensor out = like(t, shape);
  gather(t, out, axis == Axis::dim, [&](Element e) {
    index_along(e, axis) /= times;
    return e;
  });
  return out;
}

HostTensor permute(const HostTensor& t, Axis axis, const std::vector<std::int64_t>& order) {
  HostTensor out = like(t, shape_of(t));
  gather(t, out, axis == Axis::dim, [&](Element e) {
    std::int64_t& i = index_along(e, axis);
    if (i < static_cast<std::int64_t>(order.size())) i = order[static_cast<std::size_t>(i)];
    return e;
  });
  return out;
}

HostTensor with_descale(const HostTensor& t, double descale) {
  HostTensor out = t;
  out.set_descale(descale);
  for (std::int64_t n = 0; n < t.size(); ++n) out.store(n, t.load(n));
  return out;
}

HostTensor concat(const HostTensor& first, const HostTensor& second, Axis axis) {
  Shape shape = shape_of(first), other = shape_of(second);
  const auto a = static_cast<std::size_t>(axis);
  other[a] = shape[a];
  if (other != shape || first.dtype() != second.dtype() || first.descale() != second.descale())
    throw std::invalid_argument("concat of unlike tensors");
  const std::int64_t split = shape[a];
  shape[a] += extent(second, axis);
  HostTensor out = like(first, shape);
  // Whole rows at a time, unless the axis is dim itself.
  const std::int64_t run = axis == Axis::dim ? 1 : out.dim();
  Element e;
  for (e.b = 0; e.b < out.batch(); ++e.b)
    for (e.h = 0; e.h < out.heads(); ++e.h)
      for (e.s = 0; e.s < out.seqlen(); ++e.s)
        for (e.c = 0; e.c < out.dim(); e.c += run) {
          Element from = e;
          std::int64_t& i = index_along(from, axis);
          const bool in_first = i < split;
          if (!in_first) i -= split;
          const HostTensor& source = in_first ? first : second;
          copy_stored(source, source.offset(from.b, from.h, from.s, from.c), out, out.offset(e.b, e.h, e.s, e.c), run);
        }
  return out;
}

namespace {

// The mapped values (in storage order) stored in `out`. An fp8 tensor first
// takes the smallest power-of-two descale, no smaller than its own, that
// holds their largest finite magnitude, so that a map that grows the values
// (V -> 2V + 1) is not clamped at the format's largest value.
void store_mapped(HostTensor& out, const std::vector<double>& values) {
  if (is_fp8(out.dtype())) {
    double amax = 0;
    for (double x : values)
      if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
    if (amax > 0) out.set_descale(std::max(out.descale(), fp8_descale_for(out.dtype(), amax)));
  }
  for (std::int64_t n = 0; n < out.size(); ++n) out.store(n, values[static_cast<std::size_t>(n)]);
}

}  // namespace

HostTensor map_elements(const HostTensor& t, const std::function<double(double)>& f) {
  HostTensor out = t;
  std::vector<double> values(static_cast<std::size_t>(t.size()));
  for (std::int64_t n = 0; n < t.size(); ++n) values[static_cast<std::size_t>(n)] = f(t.load(n));
  store_mapped(out, values);
  return out;
}

// A change confined to some elements keeps an fp8 tensor's descale, so that
// the elements it leaves alone keep their bits (CausalPrefix compares them
// bitwise); a value past the format's range saturates.
HostTensor map_elements(const HostTensor& t, const std::function<double(const Element&, double)>& f) {
  HostTensor out = t;
  Element e;
  for (e.b = 0; e.b < t.batch(); ++e.b)
    for (e.h = 0; e.h < t.heads(); ++e.h)
      for (e.s = 0; e.s < t.seqlen(); ++e.s)
        for (e.c = 0; e.c < t.dim(); ++e.c) out.set(e.b, e.h, e.s, e.c, f(e, t.get(e.b, e.h, e.s, e.c)));
  return out;
}

ValidNorm valid_norm(const HostTensor& t, const std::function<std::int64_t(std::int64_t)>& length) {
  ValidNorm result;
  double sum = 0;
  for (std::int64_t b = 0; b < t.batch(); ++b)
    for (std::int64_t h = 0; h < t.heads(); ++h)
      for (std::int64_t s = 0; s < length(b); ++s)
        for (std::int64_t c = 0; c < t.dim(); ++c) {
          result.any = true;
          const double x = t.get(b, h, s, c);
          if (std::isfinite(x)) sum += x * x;
          else result.nonfinite = true;
        }
  result.norm = std::sqrt(sum);
  return result;
}

// ---- per-sequence row permutations -------------------------------------------

RowOrder draw_row_order(const std::vector<std::int64_t>& lengths, std::int64_t heads) {
  RowOrder order(lengths.size(), std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(heads)));
  for (std::size_t b = 0; b < lengths.size(); ++b)
    for (auto& rows : order[b]) {
      rows.resize(static_cast<std::size_t>(lengths[b]));
      std::iota(rows.begin(), rows.end(), 0);
      // Fisher-Yates, each swap drawn by RapidCheck.
      for (std::size_t n = rows.size(); n > 1; --n) std::swap(rows[n - 1], rows[*rc::gen::inRange<std::size_t>(0, n)]);
    }
  return order;
}

HostTensor permute_rows(const HostTensor& t, const RowOrder& order) {
  HostTensor out = like(t, shape_of(t));
  gather(t, out, false, [&](Element e) {
    const auto& rows = order[static_cast<std::size_t>(e.b)][static_cast<std::size_t>(e.h)];
    if (e.s < static_cast<std::int64_t>(rows.size())) e.s = rows[static_cast<std::size_t>(e.s)];
    return e;
  });
  return out;
}

AttentionRows permute_rows(const AttentionRows& rows, const RowOrder& order) {
  AttentionRows out = rows;
  for (std::int64_t b = 0; b < rows.batch; ++b)
    for (std::int64_t h = 0; h < rows.heads; ++h)
      for (std::size_t s = 0; s < order[b][h].size(); ++s) {
        const auto to = static_cast<std::int64_t>(s), from = order[b][h][s];
        std::copy_n(rows.o_row(b, h, from), rows.dim_v, out.o_row(b, h, to));
        out.lse[out.index(b, h, to)] = rows.lse[rows.index(b, h, from)];
      }
  return out;
}

std::vector<std::int64_t> lengths_q(const Problem& p) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < p.batch; ++b) lengths.push_back(p.len_q(b));
  return lengths;
}

std::vector<std::int64_t> lengths_kv(const Problem& p) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t b = 0; b < p.batch; ++b) lengths.push_back(p.len_kv(b));
  return lengths;
}

// ---- AttentionRows holding every row -------------------------------------------

namespace {

// Rows [first, first + entry.seqlen_q) of (b_from, h) of `rows` to (b_to, h) of `out`, for every h.
void copy_rows(const AttentionRows& rows, std::int64_t b_from, std::int64_t first, AttentionRows& out,
               std::int64_t b_to) {
  for (std::int64_t h = 0; h < out.heads; ++h)
    for (std::int64_t s = 0; s < out.rows.size(); ++s) {
      std::copy_n(rows.o_row(b_from, h, first + s), rows.dim_v, out.o_row(b_to, h, s));
      out.lse[out.index(b_to, h, s)] = rows.lse[rows.index(b_from, h, first + s)];
    }
}

}  // namespace

AttentionRows batch_entry(const AttentionRows& rows, std::int64_t b, const Problem& entry) {
  AttentionRows out(entry, all_rows(entry));
  copy_rows(rows, b, 0, out, 0);
  return out;
}

AttentionRows row_window(const AttentionRows& rows, std::int64_t first, const Problem& entry) {
  AttentionRows out(entry, all_rows(entry));
  for (std::int64_t b = 0; b < out.batch; ++b) copy_rows(rows, b, first, out, b);
  return out;
}

}  // namespace flashcheck::testing
