#include "flashcheck/core/values.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcheck/core/random.hpp"

namespace flashcheck {
namespace {

// dO's counters are those of residue 0 (4 mod 4), which Q, K and V never use.
enum class Which : std::uint64_t { q = 1, k = 2, v = 3, dout = 4 };

// Draws per element: a few independent counters per position.
constexpr std::uint64_t kDrawsPerElement = 64;

constexpr std::int64_t kParallelElements = 1 << 15;

struct Generator {
  const Problem& p;
  CounterRng data;
  CounterRng geometry;

  Generator(const Problem& problem)
      : p(problem), data(problem.data_seed, 0x64617461), geometry(problem.geometry_seed, 0x67656f6d) {}

  static std::uint64_t counter(Which which, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c,
                               std::int64_t heads, std::int64_t seqlen, std::int64_t dim) {
    const auto position = static_cast<std::uint64_t>(((b * heads + h) * seqlen + s) * dim + c);
    return (position * 4 + static_cast<std::uint64_t>(which)) * kDrawsPerElement;
  }

  double normal(std::uint64_t base, double mean, double std) const { return mean + std * data.normal(base); }

  // Student-t with round(nu) degrees of freedom (clamped to [1, 30]).
  double student_t(std::uint64_t base, double nu) const {
    const int dof = static_cast<int>(std::clamp(std::round(nu), 1.0, 30.0));
    double chi2 = 0;
    for (int k = 1; k <= dof; ++k) {
      const double z = data.normal(base + k);
      chi2 += z * z;
    }
    return data.normal(base) / std::sqrt(chi2 / dof);
  }

  // The key that dominates every row of (b, kv-head), for `dominant`.
  std::int64_t dominant_key(std::int64_t b, std::int64_t h) const {
    const std::int64_t len = p.len_kv(b);
    if (len == 0) return -1;
    return static_cast<std::int64_t>(geometry.bits(static_cast<std::uint64_t>(b * p.heads_kv + h)) %
                                     static_cast<std::uint64_t>(len));
  }

  double value(Which which, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c) const {
    const bool queries = which == Which::q || which == Which::dout;
    const std::int64_t heads = queries ? p.heads_q : p.heads_kv;
    const std::int64_t seqlen = queries ? p.seqlen_q : p.seqlen_kv;
    const std::int64_t dim = which == Which::v || which == Which::dout ? p.head_dim_v : p.head_dim;
    const std::uint64_t base = counter(which, b, h, s, c, heads, seqlen, dim);
    // dO is drawn from its own family, as V is: the families that shape the
    // logits through Q and K give it their normal part.
    const ValueDist& dist = which == Which::dout ? p.dout : p.values;
    const bool value_like = which == Which::v || which == Which::dout;
    const auto& prm = dist.params;
    switch (dist.family) {
      case ValueFamily::normal: return normal(base, prm[0], prm[1]);
      case ValueFamily::uniform: return prm[0] + (prm[1] - prm[0]) * data.uniform(base);
      case ValueFamily::heavy: return student_t(base, prm[0]);
      case ValueFamily::outliers: {
        const double spike = data.uniform(base + 1) < prm[0] ? prm[1] * data.normal(base + 2) : 0.0;
        return data.normal(base) + spike;
      }
      case ValueFamily::sparse_int: {
        if (data.uniform(base + 1) >= prm[1]) return 0.0;
        const auto max = static_cast<std::int64_t>(std::max(1.0, std::round(prm[0])));
        // Non-zero integer in [-max, max].
        const auto pick = static_cast<std::int64_t>(data.bits(base) % static_cast<std::uint64_t>(2 * max));
        return static_cast<double>(pick < max ? pick - max : pick - max + 1);
      }
      case ValueFamily::near_overflow: {
        if (value_like) {
          const double magnitude = prm[1] * max_finite(p.dtype) * (0.5 + 0.5 * data.uniform(base + 1));
          return data.uniform(base) < 0.5 ? -magnitude : magnitude;
        }
        // Logit standard deviation scale * sqrt(d) * sigma^2 = logit_std.
        const double sigma = std::sqrt(prm[0] / (p.softmax_scale * std::sqrt(static_cast<double>(p.head_dim))));
        return sigma * data.normal(base);
      }
      case ValueFamily::subnormal: {
        // The largest subnormal is min_normal - min_subnormal: rounding stays below min_normal.
        const double lo = min_subnormal(p.dtype), hi = min_normal(p.dtype) - min_subnormal(p.dtype);
        const double magnitude = lo + (hi - lo) * data.uniform(base + 1);
        return data.uniform(base) < 0.5 ? -magnitude : magnitude;
      }
      case ValueFamily::ties: {
        if (which != Which::k) return normal(base, 0.5, 1.0);  // Q, V, dO
        // K rows repeat a few distinct rows exactly, so scores tie exactly.
        const auto distinct = static_cast<std::uint64_t>(std::max(1.0, std::round(prm[0])));
        const auto row_id = geometry.bits(static_cast<std::uint64_t>((b * p.heads_kv + h) * p.seqlen_kv + s)) % distinct;
        const std::uint64_t shared = counter(which, b, h, static_cast<std::int64_t>(row_id), c, heads, seqlen, dim);
        return normal(shared, 0.5, 1.0);
      }
      case ValueFamily::dominant:
      case ValueFamily::late_max: {
        if (value_like) return normal(base, 0.5, 1.0);
        // Component 0 carries the designed logit: q[0] = 1 and k[0] = gap / scale
        // for the winning keys, 0 otherwise; the other components add small noise.
        const bool late = dist.family == ValueFamily::late_max;
        const double noise = late ? 0.3 : 0.1;
        if (c != 0) return noise * data.normal(base);
        if (which == Which::q) return 1.0;
        const double gap = late ? prm[1] : prm[0];
        const bool wins = late ? s >= p.len_kv(b) - static_cast<std::int64_t>(prm[0]) : s == dominant_key(b, h);
        return wins ? gap / p.softmax_scale : 0.0;
      }
      case ValueFamily::offset: {
        if (value_like) return normal(base, 0.5, 1.0);
        // The first n components carry the offset: q_c = 1 and k_c = offset / (n
        // scale), the same for every key, so every logit moves by the offset
        // (n up to 16 keeps k_c within f16's range for offsets near -6e4).
        const std::int64_t n = std::min<std::int64_t>(p.head_dim, 16);
        if (c >= n) return 0.5 * data.normal(base);
        return which == Which::q ? 1.0 : prm[0] / (static_cast<double>(n) * p.softmax_scale);
      }
      case ValueFamily::nan_inf: {
        const double u = data.uniform(base + 1);
        if (u < prm[0] || forced_special(which, b, h, s, c)) {
          const auto kind = data.bits(base + 2) % 3;
          if (kind == 0) return std::numeric_limits<double>::quiet_NaN();
          return kind == 1 ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
        }
        return normal(base, 0.5, 1.0);
      }
    }
    return 0.0;
  }

  // nan_inf always injects at least one special value into V, at a position
  // chosen by the geometry seed, so that small problems are not left clean.
  bool forced_special(Which which, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c) const {
    if (which != Which::v || p.v_elements() == 0) return false;
    const auto pick = geometry.bits(0x766e616e) % static_cast<std::uint64_t>(p.v_elements());
    const auto here = static_cast<std::uint64_t>(((b * p.heads_kv + h) * p.seqlen_kv + s) * p.head_dim_v + c);
    return pick == here;
  }

  // f(b, h, s, c) on every element of the tensor's shape, rows in parallel.
  template <typename F>
  static void for_each_element(const HostTensor& tensor, F f) {
    const std::int64_t rows = tensor.batch() * tensor.heads() * tensor.seqlen();
    // Threads only pay off past a few thousand elements; below that, spinning
    // up a team (and its busy-waiting) costs more than the work.
#pragma omp parallel for schedule(static) if (tensor.size() > kParallelElements)
    for (std::int64_t row = 0; row < rows; ++row) {
      const std::int64_t s = row % tensor.seqlen();
      const std::int64_t h = (row / tensor.seqlen()) % tensor.heads();
      const std::int64_t b = row / (tensor.seqlen() * tensor.heads());
      for (std::int64_t c = 0; c < tensor.dim(); ++c) f(b, h, s, c);
    }
  }

  void fill(Which which, HostTensor& tensor) const {
    if (!is_fp8(tensor.dtype())) {
      for_each_element(tensor, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c) {
        tensor.set(b, h, s, c, value(which, b, h, s, c));
      });
      return;
    }
    // fp8: each value drawn once and kept until the descale that holds them
    // all is known (fp8_descale_for: a power of two, so x / descale is exact
    // and the format's rounding is the only one; 1 when no value is finite and non-zero).
    std::vector<double> drawn(static_cast<std::size_t>(tensor.size()));
    for_each_element(tensor, [&](std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c) {
      drawn[static_cast<std::size_t>(tensor.offset(b, h, s, c))] = value(which, b, h, s, c);
    });
    double amax = 0;
    for (double x : drawn)
      if (std::isfinite(x)) amax = std::max(amax, std::abs(x));
    tensor.set_descale(amax > 0 ? fp8_descale_for(tensor.dtype(), amax) : 1.0);
    for (std::int64_t n = 0; n < tensor.size(); ++n) tensor.store(n, drawn[static_cast<std::size_t>(n)]);
  }
};

}  // namespace

Inputs generate_inputs(const Problem& problem) {
  if (problem.page_size > 0) {
    Problem contiguous = problem;
    contiguous.page_size = 0;
    return paged_inputs(problem, generate_inputs(contiguous), draw_page_table(problem));
  }
  const Problem& p = problem;
  Inputs in;
  in.q = HostTensor(p.dtype, p.layout, p.batch, p.heads_q, p.seqlen_q, p.head_dim);
  in.k = HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, p.seqlen_kv, p.head_dim);
  in.v = HostTensor(p.dtype, p.layout, p.batch, p.heads_kv, p.seqlen_kv, p.head_dim_v);
  const Generator generator(p);
  generator.fill(Which::q, in.q);
  generator.fill(Which::k, in.k);
  generator.fill(Which::v, in.v);
  return in;
}

HostTensor generate_dout(const Problem& p) {
  HostTensor dout(p.dtype, p.layout, p.batch, p.heads_q, p.seqlen_q, p.head_dim_v);
  Generator(p).fill(Which::dout, dout);
  return dout;
}

namespace {

// The poison of K/V slots no valid key reaches (values.hpp says why these).
void poison_unreached(const Problem& p, HostTensor& tensor) {
  if (p.values.family == ValueFamily::nan_inf) tensor.poison();
  else tensor.fill(0.0);
}

}  // namespace

Inputs paged_inputs(const Problem& p, const Inputs& contiguous, const PageTable& table) {
  if (const std::string mismatch = page_table_mismatch(p, table); !mismatch.empty() || !table.paged())
    throw std::invalid_argument("paged_inputs: " + (mismatch.empty() ? std::string("no page table") : mismatch));
  Inputs in{contiguous.q, {}, {}, table};
  const auto pool = [&](const HostTensor& logical) {
    HostTensor out(logical.dtype(), logical.layout(), table.pages, logical.heads(), table.page_size, logical.dim());
    out.set_descale(logical.descale());
    poison_unreached(p, out);
    return out;
  };
  in.k = pool(contiguous.k);
  in.v = pool(contiguous.v);
  std::vector<char> written(static_cast<std::size_t>(table.pages * table.page_size), 0);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
      const std::int64_t page = table.page_of(b, j), slot = table.slot_of(j);
      char& done = written[static_cast<std::size_t>(page * table.page_size + slot)];
      if (done) continue;
      done = 1;
      for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
        for (std::int64_t c = 0; c < in.k.dim(); ++c) in.k.set(page, hk, slot, c, contiguous.k.get(b, hk, j, c));
        for (std::int64_t c = 0; c < in.v.dim(); ++c) in.v.set(page, hk, slot, c, contiguous.v.get(b, hk, j, c));
      }
    }
  return in;
}

Inputs logical_inputs(const Problem& p, const Inputs& inputs) {
  if (!inputs.pages.paged()) return inputs;
  const PageTable& table = inputs.pages;
  Inputs in{inputs.q, HostTensor(inputs.k.dtype(), inputs.k.layout(), p.batch, p.heads_kv, p.seqlen_kv, inputs.k.dim()),
            HostTensor(inputs.v.dtype(), inputs.v.layout(), p.batch, p.heads_kv, p.seqlen_kv, inputs.v.dim()), {}};
  in.k.set_descale(inputs.k.descale());
  in.v.set_descale(inputs.v.descale());
  // Keys past a sequence's length hold the pool's poison.
  poison_unreached(p, in.k);
  poison_unreached(p, in.v);
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t j = 0; j < p.len_kv(b); ++j) {
      const std::int64_t page = table.page_of(b, j), slot = table.slot_of(j);
      for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
        for (std::int64_t c = 0; c < in.k.dim(); ++c) in.k.set(b, hk, j, c, inputs.k.get(page, hk, slot, c));
        for (std::int64_t c = 0; c < in.v.dim(); ++c) in.v.set(b, hk, j, c, inputs.v.get(page, hk, slot, c));
      }
    }
  return in;
}

}  // namespace flashcheck
