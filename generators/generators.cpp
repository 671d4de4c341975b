#include "flashcheck/generators/generators.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>

namespace flashcheck {

namespace {

// An element of `items`, uniformly, whatever RapidCheck's size, and shrinking
// toward the first. (This RapidCheck's gen::elementOf never shrinks, and
// gen::inRange narrows its range at small sizes; a fixed size of 100 keeps
// inRange's full range and its shrinking.)
template <typename T>
rc::Gen<T> element_of(std::vector<T> items) {
  if (items.empty()) throw rc::GenerationFailure("no element to pick");
  const std::size_t count = items.size();
  return rc::gen::map(rc::gen::resize(100, rc::gen::inRange<std::size_t>(0, count)),
                      [items = std::move(items)](std::size_t i) { return items[i]; });
}

}  // namespace


rc::Gen<std::int64_t> gen_seqlen(std::int64_t max) {
  std::vector<std::int64_t> edges;
  for (std::int64_t len : {0, 1, 2, 3, 7, 13, 16, 17, 31, 32, 33, 47}) edges.push_back(std::min(len, max));
  return rc::gen::weightedOneOf<std::int64_t>({
      {3, element_of(edges)},
      {2, rc::gen::inRange<std::int64_t>(0, max + 1)},
  });
}

namespace {
// normal(mean, std), mean in [-2, 2] and std in [0.1, 3.9], in steps of 0.1.
rc::Gen<ValueDist> gen_normal_values() {
  return rc::gen::map(rc::gen::pair(rc::gen::inRange(-20, 21), rc::gen::inRange(1, 40)), [](auto mean_std) {
    return ValueDist{ValueFamily::normal, {mean_std.first / 10.0, mean_std.second / 10.0}};
  });
}

// A weighted choice over a run-time list: each generator repeated `weight`
// times. elementOf shrinks toward the front, i.e. toward the first choice.
rc::Gen<ValueDist> weighted(const std::vector<std::pair<std::size_t, rc::Gen<ValueDist>>>& choices) {
  std::vector<rc::Gen<ValueDist>> pool;
  for (const auto& [weight, generator] : choices) pool.insert(pool.end(), weight, generator);
  return rc::gen::join(element_of(pool));
}
}  // namespace

rc::Gen<ValueDist> gen_value_dist(bool allow_special_values) {
  using rc::gen::just;
  std::vector<std::pair<std::size_t, rc::Gen<ValueDist>>> choices = {
      {4, gen_normal_values()},
      {1, just(ValueDist{ValueFamily::uniform, {-1.0, 1.0}})},
      {1, just(ValueDist{ValueFamily::heavy, {3.0}})},
      {1, just(ValueDist{ValueFamily::outliers, {0.01, 100.0}})},
      {1, just(ValueDist{ValueFamily::sparse_int, {3.0, 0.5}})},
      {1, just(ValueDist{ValueFamily::near_overflow, {300.0, 0.25}})},
      {1, just(ValueDist{ValueFamily::subnormal, {}})},
      {1, just(ValueDist{ValueFamily::ties, {3.0}})},
      {1, rc::gen::map(element_of(std::vector<double>{5.0, 17.5, 30.0, 90.0}),
                       [](double gap) { return ValueDist{ValueFamily::dominant, {gap}}; })},
      {1, just(ValueDist{ValueFamily::late_max, {16.0, 8.0}})},
  };
  if (allow_special_values) choices.push_back({1, just(ValueDist{ValueFamily::nan_inf, {0.002}})});
  return weighted(choices);  // shrinks toward plain normal values
}

namespace {
// True in `one_in` draws of `of`, at every size. (rc::gen::inRange scales its
// range with the size: `*inRange(0, n) == 0` is always true at the smallest
// sizes, which put far more than 1 in n on the lowest value.)
bool one_in(std::size_t of) {
  return *rc::gen::weightedElement<bool>({{1, true}, {of - 1, false}});
}
}  // namespace

rc::Gen<Problem> gen_problem(const ProblemLimits& limits) {
  return rc::gen::exec([limits] {
    Problem p;
    p.batch = *rc::gen::inRange<std::int64_t>(1, limits.max_batch + 1);
    p.heads_kv = *rc::gen::inRange<std::int64_t>(1, limits.max_heads_kv + 1);
    const std::int64_t group = *element_of(std::vector<std::int64_t>{1, 1, 2, 4, 8});
    p.heads_q = p.heads_kv * std::min(group, limits.max_group);
    p.seqlen_q = *gen_seqlen(limits.max_seqlen);
    p.seqlen_kv = *gen_seqlen(limits.max_seqlen);
    if (limits.allow_padding && *rc::gen::inRange(0, 4) == 0) {
      p.lens_q = *rc::gen::container<std::vector<std::int64_t>>(static_cast<std::size_t>(p.batch),
                                                                rc::gen::inRange<std::int64_t>(0, p.seqlen_q + 1));
      p.lens_kv = *rc::gen::container<std::vector<std::int64_t>>(static_cast<std::size_t>(p.batch),
                                                                 rc::gen::inRange<std::int64_t>(0, p.seqlen_kv + 1));
    }
    const std::int64_t max_d = limits.max_head_dim;
    p.head_dim = *rc::gen::weightedOneOf<std::int64_t>(
        {{3, element_of(std::vector<std::int64_t>{1, 8, 16, 32, std::min<std::int64_t>(64, max_d)})},
         {1, rc::gen::inRange<std::int64_t>(1, max_d + 1)}});
    p.head_dim_v = *rc::gen::weightedOneOf<std::int64_t>(
        {{3, rc::gen::just(p.head_dim)}, {1, rc::gen::inRange<std::int64_t>(1, max_d + 1)}});
    p.dtype = *rc::gen::element(DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2);
    p.layout = *rc::gen::element(Layout::bhsd, Layout::bshd);
    p.mask = *rc::gen::element(MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window);
    if (p.mask == MaskKind::window) {
      // Windows of 0, small, wider than the sequence, and unbounded sides.
      const auto bound = rc::gen::weightedOneOf<std::int64_t>(
          {{1, rc::gen::just<std::int64_t>(-1)},
           {1, rc::gen::just<std::int64_t>(0)},
           {2, rc::gen::inRange<std::int64_t>(0, 8)},
           {1, rc::gen::inRange<std::int64_t>(0, 2 * limits.max_seqlen + 2)}});
      p.window_left = *bound;
      p.window_right = *bound;
    }
    p.softmax_scale = *rc::gen::weightedOneOf<double>(
        {{3, rc::gen::just(default_softmax_scale(p.head_dim))},
         {1, rc::gen::map(rc::gen::inRange(1, 200), [](int s) { return s / 100.0; })}});
    p.values = *gen_value_dist(limits.allow_special_values);
    if (limits.score_mods) {  // each in 1 draw of 4
      if (one_in(4)) p.softcap = *rc::gen::element(0.5, 1.0, 5.0, 30.0, 50.0);
      p.alibi = one_in(4);
    }
    if (limits.paged && one_in(3)) p.page_size = *rc::gen::inRange<std::int64_t>(1, p.seqlen_kv + 3);
    p.geometry_seed = *rc::gen::arbitrary<std::uint64_t>();
    p.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return p;
  });
}

namespace {


// exp underflow points: -ln of the smallest normal and subnormal of each type.
// A logit gap there puts the losing weights exactly at the edge of what the
// arithmetic can represent.
const std::vector<double> kUnderflowGaps = {
    9.70406,   // f16 smallest normal  2^-14
    16.6355,   // f16 smallest subnormal 2^-24
    87.3365,   // f32/bf16 smallest normal 2^-126
    92.1893,   // bf16 smallest subnormal 2^-133
    103.279,   // f32 smallest subnormal 2^-149
};

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return multiple <= 1 ? value : (value + multiple - 1) / multiple * multiple;
}

// Lengths in [lowest, max] (multiples of `multiple`), weighted toward the
// edges: 1, 2, the tile sizes +-1, primes around the usual powers of two.
// Each edge is listed once (a tile of 1 makes tile - 1 = 0 and tile = 1 edges
// that the list already holds), and 0 is never drawn: the empty shapes have
// their own draw (DomainLimits::vacuous_only).
rc::Gen<std::int64_t> gen_length(std::int64_t tile, std::int64_t multiple, std::int64_t max) {
  std::vector<std::int64_t> usable;
  for (std::int64_t length : {std::int64_t{1}, std::int64_t{2}, tile - 1, tile, tile + 1, 2 * tile - 1, 2 * tile + 1,
                              std::int64_t{97}, std::int64_t{113}, std::int64_t{1023}, std::int64_t{1025}}) {
    const std::int64_t rounded = round_up(length, multiple);
    if (rounded >= 1 && rounded <= max && std::find(usable.begin(), usable.end(), rounded) == usable.end())
      usable.push_back(rounded);
  }
  if (usable.empty()) usable.push_back(round_up(1, multiple));
  const std::int64_t top = std::max<std::int64_t>(1, std::min<std::int64_t>(max, 4 * tile));
  return rc::gen::weightedOneOf<std::int64_t>({
      {3, element_of(usable)},
      {2, rc::gen::map(rc::gen::inRange<std::int64_t>(1, top + 1),
                       [multiple](std::int64_t n) { return round_up(n, multiple); })},
  });
}

double work_of(const Problem& p) {
  return static_cast<double>(p.batch) * p.heads_q * p.seqlen_q * p.seqlen_kv * (p.head_dim + p.head_dim_v);
}

// Shrinks a drawn problem until it fits the work and memory budget: the batch,
// then the heads, then the longer sequence (keeping the domain's multiples).
void fit_budget(Problem& p, const Capabilities& caps, const DomainLimits& limits) {
  auto bytes = [&] { return p.storage_bytes() * 3; };  // inputs, outputs and the oracle's copies
  while (work_of(p) > limits.max_work || bytes() > limits.max_bytes) {
    if (p.batch > 1) {
      p.batch = 1;
      // erase rather than resize(1): GCC 12 warns falsely (-Warray-bounds) on the latter here.
      if (!p.lens_q.empty()) p.lens_q.erase(p.lens_q.begin() + 1, p.lens_q.end());
      if (!p.lens_kv.empty()) p.lens_kv.erase(p.lens_kv.begin() + 1, p.lens_kv.end());
    } else if (p.heads_kv > 2 || (p.heads_kv > 1 && p.heads_q == p.heads_kv)) {
      // Fewer K/V heads at the same ratio: a GQA shape (2 K/V heads or more)
      // stays GQA, so that the ratios stay evenly drawn.
      const std::int64_t group = p.group_size();
      p.heads_kv = p.heads_q == p.heads_kv ? 1 : 2;
      p.heads_q = p.heads_kv * group;
    } else {
      std::int64_t& longer = p.seqlen_q >= p.seqlen_kv ? p.seqlen_q : p.seqlen_kv;
      const std::int64_t multiple = &longer == &p.seqlen_q ? caps.seqlen_q_multiple : caps.seqlen_kv_multiple;
      const std::int64_t halved = round_up(longer / 2, multiple);
      if (halved >= longer || halved < 1) {
        // The lengths cannot shrink further within the domain: the heads give way.
        if (p.heads_kv > 1) {
          p.heads_q /= p.heads_kv;
          p.heads_kv = 1;
        } else if (p.heads_q > 1) {
          p.heads_q = 1;
        } else {
          break;
        }
        continue;
      }
      longer = halved;
      for (auto* lens : {&p.lens_q, &p.lens_kv})
        for (auto& len : *lens) len = std::min(len, lens == &p.lens_q ? p.seqlen_q : p.seqlen_kv);
    }
  }
}

// Long contexts (DomainLimits::long_contexts): a decode shape (1 to 16 queries)
// over up to 262144 keys, or a prefill of 4096 to 32768 queries and keys, both
// within the domain's max_seqlen_* (nothing when it allows neither). CPU
// subjects get decode shapes and prefills of 4096 at most: a CPU subject
// computes every row, and 32768^2 rows would take it an hour. One sequence,
// the drawn heads while the buffers fit max_bytes.
bool draw_long_context(Problem& p, const Capabilities& caps, const DomainLimits& limits) {
  std::vector<std::pair<std::int64_t, std::int64_t>> shapes;  // (seqlen_q, seqlen_kv)
  for (std::int64_t sq : {1, 4, 16})
    for (std::int64_t skv : {32768, 131072, 262144}) shapes.emplace_back(sq, skv);
  for (std::int64_t n : {4096, 16384, 32768})
    if (caps.needs_gpu || n <= 4096) shapes.emplace_back(n, n);
  std::vector<std::pair<std::int64_t, std::int64_t>> usable;
  for (auto [sq, skv] : shapes) {
    sq = round_up(sq, caps.seqlen_q_multiple);
    skv = round_up(skv, caps.seqlen_kv_multiple);
    if (sq <= caps.max_seqlen_q && skv <= caps.max_seqlen_kv) usable.emplace_back(sq, skv);
  }
  if (usable.empty()) return false;
  std::tie(p.seqlen_q, p.seqlen_kv) = *element_of(usable);
  p.batch = 1;
  p.lens_q.clear();
  p.lens_kv.clear();
  while (p.storage_bytes() * 3 > limits.max_bytes && p.heads_q > 1) {
    if (p.heads_kv > 1) {
      p.heads_q /= p.heads_kv;
      p.heads_kv = 1;
    } else {
      p.heads_q = 1;
    }
  }
  // The inputs are drawn on the host and the oracles scan every key of each
  // sampled row: the heads give way above 2^26 K/V elements (512 MiB of f64
  // for the oracle's copy) and, for a CPU subject (which computes every row),
  // above 2.5e8 multiply-adds, about 10 s on one core.
  const auto too_big = [&] {
    return p.k_elements() + p.v_elements() > (std::int64_t{1} << 26) || (!caps.needs_gpu && work_of(p) > 2.5e8);
  };
  while (too_big() && p.heads_q > 1) {
    if (p.heads_kv > 1) {
      p.heads_q /= p.heads_kv;
      p.heads_kv = 1;
    } else {
      p.heads_q = std::max<std::int64_t>(1, p.heads_q / 2);
    }
  }
  while (too_big() && p.seqlen_kv > 32768) p.seqlen_kv = round_up(p.seqlen_kv / 2, caps.seqlen_kv_multiple);
  return !too_big() && p.storage_bytes() * 3 <= limits.max_bytes;  // else the usual lengths
}

// Empty and fully masked shapes (DomainLimits::vacuous_only). Under every
// mask the last valid query row of a sequence sees its last key (causal_tl's
// first row sees the first), so a problem is vacuous exactly when no sequence
// has both a query and a key: sq = 0, skv = 0 (every row fully masked), both,
// or a padded batch whose sequences each lack one or the other.
void draw_vacuous_lengths(Problem& p, const Capabilities& caps, std::int64_t max_q, std::int64_t max_kv) {
  const std::int64_t shape = *element_of(caps.varlen ? std::vector<std::int64_t>{0, 1, 2, 3}
                                                             : std::vector<std::int64_t>{0, 1, 2});
  const auto length = [](std::int64_t tile, std::int64_t multiple, std::int64_t max) {
    return *gen_length(tile, multiple, max);
  };
  p.seqlen_q = shape == 1 ? length(caps.tile_q, caps.seqlen_q_multiple, max_q) : 0;
  p.seqlen_kv = shape == 0 ? length(caps.tile_kv, caps.seqlen_kv_multiple, max_kv) : 0;
  if (shape == 3) {  // padded: each sequence empty on one side or both
    p.seqlen_q = length(caps.tile_q, caps.seqlen_q_multiple, max_q);
    p.seqlen_kv = length(caps.tile_kv, caps.seqlen_kv_multiple, max_kv);
    p.batch = *rc::gen::inRange<std::int64_t>(2, 5);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const auto side = *rc::gen::element(0, 1, 2);  // 0: no queries, 1: no keys, 2: neither
      p.lens_q.push_back(side == 0 || side == 2 ? 0 : *rc::gen::inRange<std::int64_t>(1, p.seqlen_q + 1));
      p.lens_kv.push_back(side == 1 || side == 2 ? 0 : *rc::gen::inRange<std::int64_t>(1, p.seqlen_kv + 1));
    }
  }
}

}  // namespace

Problem retyped(const Problem& problem, DType dtype) {
  Problem p = problem;
  p.dtype = dtype;
  const auto rescale = [&](ValueDist& values) {
    if (values.family == ValueFamily::near_overflow && values.params.size() > 1)
      values.params[1] *= max_finite(problem.dtype) / max_finite(dtype);
  };
  rescale(p.values);
  rescale(p.dout);
  return p;
}

rc::Gen<ValueDist> gen_values_for(DType storage, DType compute, std::int64_t tile_kv, bool allow_special_values,
                                  std::int64_t seqlen_kv) {
  using rc::gen::just;
  // |V| near the maximum of the dtype the subject computes in, but small enough
  // that an unnormalised f32 accumulator over the row's keys (2048 at least)
  // cannot overflow (f16 keeps half its range; bf16 and f32 share f32's range,
  // so their V stays 1 / (2 keys) of it: 2^-12 up to 2048 keys). That is the
  // one-pass softmax's declared limit (Capabilities::accumulator_max).
  // near_overflow's parameter is a fraction of the storage max.
  const double keys = static_cast<double>(std::max<std::int64_t>(seqlen_kv, 2048));
  const double v_magnitude = compute == DType::f16 ? std::min(0.5 * max_finite(DType::f16), max_finite(DType::f32) / (2 * keys))
                                                   : max_finite(compute) / (2 * keys);
  const double v_frac = v_magnitude / max_finite(storage);
  std::vector<std::pair<std::size_t, rc::Gen<ValueDist>>> choices = {
      {6, rc::gen::map(rc::gen::pair(rc::gen::inRange(-20, 21), rc::gen::inRange(1, 40)),
                       [](auto mean_std) {
                         return ValueDist{ValueFamily::normal, {mean_std.first / 10.0, mean_std.second / 10.0}};
                       })},
      {1, just(ValueDist{ValueFamily::uniform, {-1.0, 1.0}})},
      {1, just(ValueDist{ValueFamily::heavy, {3.0}})},
      {2, just(ValueDist{ValueFamily::outliers, {0.001, 100.0}})},
      {2, rc::gen::map(rc::gen::inRange(1, 5), [](int max) { return ValueDist{ValueFamily::sparse_int, {double(max), 0.5}}; })},
      {1, just(ValueDist{ValueFamily::near_overflow, {1000.0, v_frac}})},
      {1, just(ValueDist{ValueFamily::subnormal, {}})},
      {1, rc::gen::map(rc::gen::inRange(1, 5), [](int distinct) { return ValueDist{ValueFamily::ties, {double(distinct)}}; })},
      {3, rc::gen::map(rc::gen::pair(element_of(kUnderflowGaps), rc::gen::element(-0.01, 0.0, 0.01)),
                       [](auto gap) { return ValueDist{ValueFamily::dominant, {gap.first + gap.second}}; })},
      {2, rc::gen::map(rc::gen::inRange(2, 25),
                       [tile_kv](int gap) { return ValueDist{ValueFamily::late_max, {double(tile_kv), double(gap)}}; })},
      {1, rc::gen::map(rc::gen::element(-60000.0, -5.1e4, -1e3),
                       [](double offset) { return ValueDist{ValueFamily::offset, {offset}}; })},
  };
  if (allow_special_values)
    choices.push_back({1, rc::gen::map(rc::gen::element(0.0, 0.002, 0.02),
                                       [](double p) { return ValueDist{ValueFamily::nan_inf, {p}}; })});
  std::vector<rc::Gen<ValueDist>> pool;
  for (const auto& [weight, generator] : choices) pool.insert(pool.end(), weight, generator);
  return rc::gen::join(element_of(pool));
}

rc::Gen<ValueDist> gen_dout_values() {
  using rc::gen::just;
  return weighted({
      {6, gen_normal_values()},
      {1, just(ValueDist{ValueFamily::uniform, {-1.0, 1.0}})},
      {1, just(ValueDist{ValueFamily::heavy, {3.0}})},
      {1, just(ValueDist{ValueFamily::outliers, {0.001, 100.0}})},
      {1, rc::gen::map(rc::gen::inRange(1, 5), [](int max) { return ValueDist{ValueFamily::sparse_int, {double(max), 0.5}}; })},
  });
}

namespace {

// The pool of a domain that declares one (Capabilities::geometry_pool), per
// (domain, limits): problems drawn once, with fixed seeds, by the pool-free
// generator, so that every process and every run draws from the same ones and
// a failure's line replays as it is.
const std::vector<Problem>& problem_pool(const Capabilities& caps, const DomainLimits& limits) {
  static std::mutex mutex;
  static std::map<std::string, std::vector<Problem>> pools;
  const std::string key =
      fmt::format("{}|{} {} {} {} {} {} {} {} {} {} {}", describe(caps), limits.max_seqlen, limits.max_head_dim,
                  limits.max_work, limits.max_bytes, limits.allow_special_values, limits.vacuous_only,
                  limits.long_contexts, caps.geometry_pool, limits.softcap, limits.alibi, limits.paged) +
      (limits.backward ? " bwd" : "");
  const std::lock_guard lock(mutex);
  std::vector<Problem>& pool = pools[key];
  if (!pool.empty()) return pool;
  DomainLimits free = limits;
  free.use_geometry_pool = false;
  free.backward_share = 0;  // the pool holds geometries; gen_problem_in makes some of them backward
  const rc::Gen<Problem> draw = gen_problem_in(caps, free);
  constexpr std::uint64_t kPoolSeed = 20261125;
  for (std::uint64_t n = 0; pool.size() < static_cast<std::size_t>(caps.geometry_pool) && n < 50u * caps.geometry_pool;
       ++n) {
    try {
      // Sizes across RapidCheck's range, so the pool holds small and large shapes.
      pool.push_back(draw(rc::Random(kPoolSeed + n), static_cast<int>(n * 37 % 100)).value());
    } catch (...) {  // a draw the generator discarded: take the next seed
    }
  }
  return pool;
}

}  // namespace

namespace {
rc::Gen<Problem> gen_forward_problem_in(const Capabilities& caps, const DomainLimits& limits);

// Draws from `gen` until `accept` holds, at the same size, up to 32 times
// (then a discard). Not rc::gen::suchThat: it grows the size with every
// retry, which drew larger problems after each rejection (measured: a 30 s
// cpu-plain sweep ran 1402 cases/min with it, 2597 with discards).
template <typename Accept>
rc::Gen<Problem> redrawn(rc::Gen<Problem> gen, Accept accept) {
  return rc::gen::exec([gen = std::move(gen), accept] {
    for (int attempt = 0; attempt < 32; ++attempt) {
      Problem p = *gen;
      if (accept(p)) return p;
    }
    RC_DISCARD("32 draws in a row outside what the generator keeps to");
  });
}
}  // namespace

rc::Gen<Problem> gen_problem_in(const Capabilities& caps, const DomainLimits& limits) {
  const double share = limits.backward ? 1.0 : limits.backward_share;
  DomainLimits forward_limits = limits;
  forward_limits.backward = false;
  if (!caps.backward || share <= 0) return gen_forward_problem_in(caps, forward_limits);
  // A backward case costs the subject about 2.5 forwards, and the judge the
  // f64 forward on every query row (the O and LSE it hands over) besides the
  // gradients: its geometry gets 1/2.5 of the work, and no long prefill.
  DomainLimits backward_limits = limits;
  backward_limits.backward = true;
  backward_limits.max_work = limits.max_work / 2.5;
  const rc::Gen<Problem> backward = gen_forward_problem_in(caps, backward_limits);
  const std::int64_t max_seqlen = limits.max_seqlen;
  const rc::Gen<Problem> backward_only = rc::gen::exec([backward, max_seqlen, caps] {
    Problem p = *redrawn(backward, [max_seqlen](const Problem& q) { return q.seqlen_q <= max_seqlen; });
    // Not Q, K, V at the dtype's range edge: a gradient sums products of
    // them, and lands past the dtype's range (an infinity, or a finite value
    // whose rounding errors reach the range) where the f64 oracle's is
    // finite; the gradients' overflow is not judged (measured: cpu-plain's
    // f16 dQ rounded to -inf where the oracle's is -64486, 1.6% inside).
    if (p.values.family == ValueFamily::near_overflow) {  // redrawn, not discarded (the properties' discard budget)
      p.values = *rc::gen::suchThat(gen_value_dist(/*allow_special_values=*/false),
                                    [](const ValueDist& v) { return v.family != ValueFamily::near_overflow; });
      // As gen_forward_problem_in: f16 logits of heavy or outlier values stay at the default scale.
      const bool f16_logits = p.dtype == DType::f16 || caps.compute_dtype == DType::f16;
      if (f16_logits && (p.values.family == ValueFamily::outliers || p.values.family == ValueFamily::heavy))
        p.softmax_scale = std::min(p.softmax_scale, default_softmax_scale(p.head_dim));
    }
    return p;
  });
  if (share >= 1) return backward_only;
  const auto weight = static_cast<std::size_t>(share * 1000);
  return rc::gen::weightedOneOf<Problem>(
      {{1000 - weight, gen_forward_problem_in(caps, forward_limits)}, {weight, backward_only}});
}

namespace {
rc::Gen<Problem> gen_forward_problem_in(const Capabilities& caps, const DomainLimits& limits) {
  if (caps.geometry_pool > 0 && limits.use_geometry_pool) {
    return rc::gen::exec([caps, limits] {
      const std::vector<Problem>& pool = problem_pool(caps, limits);
      RC_PRE(!pool.empty());
      Problem p = *element_of(pool);
      // The geometry is the pool's; the data are new in every case.
      p.geometry_seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
      p.data_seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
      return p;
    });
  }
  const rc::Gen<Problem> drawn = rc::gen::exec([caps, limits] {
    Problem p;
    std::vector<DType> dtypes;
    for (DType t : kDTypes)
      if (caps.dtypes.contains(t) && !(is_fp8(t) && limits.backward)) dtypes.push_back(t);  // fp8: forward only
    std::vector<MaskKind> masks;
    for (MaskKind m : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window})
      if (caps.masks.contains(m)) masks.push_back(m);
    std::vector<Layout> layouts;
    for (Layout l : {Layout::bhsd, Layout::bshd})
      if (caps.layouts.contains(l)) layouts.push_back(l);
    RC_PRE(!dtypes.empty() && !masks.empty() && !layouts.empty());
    p.dtype = *element_of(dtypes);
    p.mask = *element_of(masks);
    p.layout = *element_of(layouts);

    // Head dims: the listed ones, or the common ones and odd ones in the range.
    if (caps.head_dims[0] != 0) {
      std::vector<std::int64_t> listed;
      for (auto d : caps.head_dims)
        if (d != 0) listed.push_back(d);
      p.head_dim = *element_of(listed);
    } else {
      const std::int64_t lo = caps.min_head_dim, hi = std::min(caps.max_head_dim, limits.max_head_dim);
      std::vector<std::int64_t> common;
      for (std::int64_t d : {1, 3, 8, 16, 17, 32, 33, 64, 80, 96, 128, 256})
        if (d >= lo && d <= hi) common.push_back(d);
      p.head_dim = common.empty() ? *rc::gen::inRange(lo, hi + 1)
                                  : *rc::gen::weightedOneOf<std::int64_t>(
                                        {{3, element_of(common)}, {1, rc::gen::inRange(lo, hi + 1)}});
      // Backward: the large head dims in 1 case of 4 (DomainLimits::backward).
      std::vector<std::int64_t> large;
      for (std::int64_t d : {160, 192, 224, 256})
        if (d >= lo && d <= hi) large.push_back(d);
      if (limits.backward && !large.empty() && one_in(4)) p.head_dim = *element_of(large);
    }
    p.head_dim_v = p.head_dim;
    if (!caps.head_dim_v_equal && one_in(4))
      p.head_dim_v = *rc::gen::inRange<std::int64_t>(1, std::min(caps.max_head_dim_v, limits.max_head_dim) + 1);
    p.head_dim_v = std::min(p.head_dim_v, caps.max_head_dim_v);
    // The softmax scale, drawn (issue 20: a kernel that hard-codes 1/sqrt(d)
    // passed every check while the scale was always the default). Shares, in
    // sixteenths (kScaleShares): the default 1/sqrt(d) in 8 (half the cases:
    // what models use), 1 in 2 (a scale folded into Q), small ones in 3 (1/4 and
    // 1/16 of the default: flatter weights, O near the mean of V) and large ones
    // in 3 (4 and 16 times the default: logits 4 to 16 times their usual
    // spread, sharp weights down to exp's underflow). weightedElement, unlike
    // inRange, ignores RapidCheck's size: with inRange, the first half of a
    // run (small sizes) drew only the default. Families that design their
    // logits keep the default: see the line after the values are drawn.
    {
      enum ScaleKind { standard, one, small, large };
      static constexpr std::pair<std::size_t, ScaleKind> kScaleShares[] = {
          {8, standard}, {2, one}, {3, small}, {3, large}};
      const double default_scale = default_softmax_scale(p.head_dim);
      const ScaleKind kind =
          *rc::gen::weightedElement<ScaleKind>({kScaleShares[0], kScaleShares[1], kScaleShares[2], kScaleShares[3]});
      switch (kind) {
        case standard: p.softmax_scale = default_scale; break;
        case one: p.softmax_scale = 1.0; break;
        case small: p.softmax_scale = default_scale * *rc::gen::element(0.25, 0.0625); break;
        case large: p.softmax_scale = default_scale * *rc::gen::element(4.0, 16.0); break;
      }
    }

    // Heads: GQA ratios 1, 2, 4, 8 and MQA, evenly.
    std::tie(p.heads_q, p.heads_kv) = *gen_grouped_heads(caps);
    p.batch = *rc::gen::inRange<std::int64_t>(1, 4);

    const std::int64_t max_q = std::min(caps.max_seqlen_q, limits.max_seqlen);
    const std::int64_t max_kv = std::min(caps.max_seqlen_kv, limits.max_seqlen);
    // Long contexts: 1 in 40 cases of a GPU subject, 1 in 400 of a CPU one
    // (it computes every row of them, at about 10 s a case on one core).
    const bool long_context = limits.long_contexts && !limits.vacuous_only && one_in(caps.needs_gpu ? 40 : 400) &&
                              draw_long_context(p, caps, limits);
    if (limits.vacuous_only) {
      if (!caps.empty_sequences) RC_DISCARD("the domain has no empty sequence, so no vacuous shape");
      draw_vacuous_lengths(p, caps, max_q, max_kv);
    } else if (!long_context) {
      p.seqlen_q = *gen_length(caps.tile_q, caps.seqlen_q_multiple, max_q);
      p.seqlen_kv = *gen_length(caps.tile_kv, caps.seqlen_kv_multiple, max_kv);
      if (caps.varlen && one_in(3)) {
        // Padded batch: per-sequence lengths, 1 in 8 of them empty where
        // allowed, with at least one sequence of queries and keys.
        p.batch = *rc::gen::inRange<std::int64_t>(2, 5);
        const auto per_sequence = [&caps](std::int64_t padded) {
          if (caps.empty_sequences && one_in(8)) return std::int64_t{0};
          return *rc::gen::weightedOneOf<std::int64_t>(
              {{1, rc::gen::just(padded)}, {1, rc::gen::just<std::int64_t>(1)}, {4, rc::gen::inRange<std::int64_t>(1, padded + 1)}});
        };
        bool compares = false;
        for (std::int64_t b = 0; b < p.batch; ++b) {
          p.lens_q.push_back(per_sequence(p.seqlen_q));
          p.lens_kv.push_back(per_sequence(p.seqlen_kv));
          compares = compares || (p.lens_q.back() > 0 && p.lens_kv.back() > 0);
        }
        if (!compares) {
          const auto b = static_cast<std::size_t>(*rc::gen::inRange<std::int64_t>(0, p.batch));
          p.lens_q[b] = std::max<std::int64_t>(p.lens_q[b], 1);
          p.lens_kv[b] = std::max<std::int64_t>(p.lens_kv[b], 1);
        }
      }
    }
    if (p.mask == MaskKind::window) {
      const std::int64_t longest = std::max(p.seqlen_q, p.seqlen_kv);
      const auto bound = rc::gen::weightedOneOf<std::int64_t>({{1, rc::gen::just<std::int64_t>(-1)},
                                                               {2, rc::gen::just<std::int64_t>(0)},
                                                               {3, rc::gen::inRange<std::int64_t>(1, 9)},
                                                               {1, rc::gen::just(caps.tile_kv)},
                                                               {2, rc::gen::just(longest + 3)}});
      p.window_left = *bound;
      p.window_right = *bound;
    }
    if (!long_context) fit_budget(p, caps, limits);
    // A domain whose bottom-right aligned masks need Sq <= Skv gets the two
    // lengths the other way round, rather than a discarded case.
    if (caps.aligned_masks_need_sq_le_skv && (p.mask == MaskKind::causal_br || p.mask == MaskKind::window) &&
        p.seqlen_q > p.seqlen_kv && caps.seqlen_q_multiple == caps.seqlen_kv_multiple) {
      std::swap(p.seqlen_q, p.seqlen_kv);
      std::swap(p.lens_q, p.lens_kv);
    }
    p.values = *gen_values_for(p.dtype, caps.compute_dtype.value_or(p.dtype), caps.tile_kv,
                               limits.allow_special_values && caps.nonfinite_inputs, p.seqlen_kv);
    // dominant, late_max and offset place their logits (at exp's underflow
    // points, past f16's range) by K = logit / scale, sized for the default
    // scale: a smaller one overflows K in f16, a larger one multiplies the noise
    // around the designed gap. They keep the default scale.
    // nan_inf keeps at most the default: a larger scale widens the logit gaps
    // until the weight of an Inf value underflows to 0 in the working dtype,
    // and 0 x Inf = NaN where the f64 oracle has +-Inf (a limit of the dtype,
    // not of a kernel; measured: cpu-lowp, f16, d=1, scale=4).
    if (p.values.family == ValueFamily::dominant || p.values.family == ValueFamily::late_max ||
        p.values.family == ValueFamily::offset)
      p.softmax_scale = default_softmax_scale(p.head_dim);
    if (p.values.family == ValueFamily::nan_inf)
      p.softmax_scale = std::min(p.softmax_scale, default_softmax_scale(p.head_dim));
    // So do outliers and heavy tails in f16: two spikes of 100 meet in a logit
    // of 1e4 x scale, past f16's 65504 at 16 x the default (measured: cpu-lowp,
    // which rounds S to f16, NaN where the f64 oracle is finite).
    const bool f16_logits = p.dtype == DType::f16 || caps.compute_dtype == DType::f16;
    if (f16_logits && (p.values.family == ValueFamily::outliers || p.values.family == ValueFamily::heavy))
      p.softmax_scale = std::min(p.softmax_scale, default_softmax_scale(p.head_dim));
    if (limits.backward) {
      p.pass = Pass::bwd;
      p.dout = *gen_dout_values();
    }
    // The score modifications, where the domain and the property take them:
    // each in 1 draw of 4; softcaps from 1 (every logit squeezed) to Gemma 2's 50.
    if (caps.softcap && limits.softcap && one_in(4)) p.softcap = *rc::gen::element(1.0, 5.0, 30.0, 50.0);
    // Not ALiBi with NaN/Inf values: its bias widens a row's logit gaps up to
    // slope x Lk (256 at 1024 keys), past f32's exp underflow (87), and a
    // weight 0 x Inf is NaN where the f64 oracle has +-Inf (the limit of the
    // dtype that keeps nan_inf at the default scale above; measured: cpu-plain,
    // 1025 keys, dK NaN where both f64 oracles give Inf).
    if (caps.alibi && limits.alibi && p.values.family != ValueFamily::nan_inf && one_in(4)) p.alibi = true;
    // A paged K/V cache: pages of one key (every key its own page) to 256,
    // most smaller than the keys so that the table's shuffle and sharing show.
    if (caps.min_page_size > 0 && limits.paged && p.pass == Pass::fwd && one_in(3)) {
      std::vector<std::int64_t> sizes;
      for (std::int64_t size : {1, 2, 3, 7, 16, 17, 32, 64, 128, 256}) {
        size = std::max(size, caps.min_page_size);
        size = (size + caps.page_size_multiple - 1) / caps.page_size_multiple * caps.page_size_multiple;
        if (caps.page_size_power_of_two && (size & (size - 1)) != 0) continue;
        sizes.push_back(size);
      }
      p.page_size = *rc::gen::elementOf(sizes);
    }
    p.geometry_seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
    p.data_seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 20);
    return p;
  });
  // Redrawn, not discarded: a draw whose mask and lengths leave every row
  // without a key (or, under vacuous_only, one that compares something), or
  // that a domain rule the construction above does not follow refuses. A
  // discard counts against each property's 10% budget (kMaxDiscardShare):
  // measured, 13 of 113 draws of a backward property on the GPU.
  return redrawn(drawn, [caps, limits](const Problem& p) {
    return limits.vacuous_only == (visible_rows(p) == 0) && !unsupported_reason(caps, p);
  });
}
}  // namespace

rc::Gen<std::pair<std::int64_t, std::int64_t>> gen_grouped_heads(const Capabilities& caps, bool grouped_only) {
  using Heads = std::pair<std::int64_t, std::int64_t>;  // (heads_q, heads_kv)
  if (!caps.gqa) {
    if (grouped_only) return rc::gen::exec([]() -> Heads { RC_DISCARD("the domain has no GQA"); });
    return rc::gen::map(rc::gen::inRange<std::int64_t>(1, 4), [](std::int64_t h) { return Heads{h, h}; });
  }
  // One shape per entry, so each is drawn as often as the others: ratio 1
  // (1 to 3 heads), true GQA 2, 4, 8 (2 or 3 K/V heads), MQA (1 K/V head, 2 to 8 query heads).
  std::vector<rc::Gen<Heads>> shapes;
  if (!grouped_only)
    shapes.push_back(rc::gen::map(rc::gen::inRange<std::int64_t>(1, 4), [](std::int64_t h) { return Heads{h, h}; }));
  for (std::int64_t ratio : {2, 4, 8})
    shapes.push_back(rc::gen::map(rc::gen::inRange<std::int64_t>(2, 4),
                                  [ratio](std::int64_t kv) { return Heads{kv * ratio, kv}; }));
  shapes.push_back(rc::gen::map(rc::gen::element<std::int64_t>(2, 4, 8), [](std::int64_t q) { return Heads{q, 1}; }));
  return rc::gen::join(element_of(shapes));
}

namespace {

std::string length_class(std::int64_t length, std::int64_t tile) {
  if (length >= 4096) return "long";
  if (length <= 1) return std::to_string(length);
  if (tile > 2) {
    if (length == tile - 1) return "tile-1";
    if (length == tile) return "tile";
    if (length == tile + 1) return "tile+1";
  }
  if (length < tile) return "<tile";
  if (length < 4 * tile) return "<4tile";
  return "<4096";
}

}  // namespace

std::vector<std::string> coverage_labels(const Problem& p, const Capabilities& caps) {
  std::string gqa = p.heads_q == p.heads_kv ? "1"
                    : p.heads_kv == 1       ? "mqa"
                                            : std::to_string(p.group_size());
  const bool default_scale = std::abs(p.softmax_scale - default_softmax_scale(p.head_dim)) <= 1e-12 * p.softmax_scale;
  return {
      fmt::format("dtype={}", to_string(p.dtype)),
      fmt::format("mask={}", to_string(p.mask)),
      fmt::format("gqa={}", gqa),
      fmt::format("len_q={}", length_class(p.seqlen_q, caps.tile_q)),
      fmt::format("len_kv={}", length_class(p.seqlen_kv, caps.tile_kv)),
      fmt::format("padded={}", p.padded() ? "yes" : "no"),
      fmt::format("values={}", to_string(p.values.family)),
      fmt::format("scale={}", default_scale ? "default" : "other"),
      fmt::format("vacuous={}", visible_rows(p) == 0 ? "yes" : "no"),
      fmt::format("pass={}", to_string(p.pass)),
      fmt::format("mods={}", p.softcap > 0 && p.alibi ? "softcap+alibi"
                             : p.softcap > 0          ? "softcap"
                             : p.alibi                ? "alibi"
                                                      : "none"),
      fmt::format("page={}", p.page_size == 0 ? "none" : p.page_size < 16 ? "<16" : "16+"),
  };
}

rc::Gen<Problem> gen_problem_outside(const Capabilities& caps) {
  return rc::gen::exec([caps] {
    // A problem inside the domain, then one field moved out of it.
    Problem p = *gen_problem_in(caps, {.max_seqlen = 64, .max_work = 1e6});
    std::vector<std::function<void(Problem&)>> breaks;
    for (DType t : kDTypes)
      if (!caps.dtypes.contains(t))
        breaks.push_back([t](Problem& q) {
          q.dtype = t;
          if (!is_fp8(t)) return;
          q.pass = Pass::fwd;  // fp8 is the forward's
          q.dout = Problem{}.dout;
        });
    for (MaskKind m : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window})
      if (!caps.masks.contains(m))
        breaks.push_back([m](Problem& q) {
          q.mask = m;
          q.window_left = q.window_right = m == MaskKind::window ? 3 : -1;
        });
    for (Layout l : {Layout::bhsd, Layout::bshd})
      if (!caps.layouts.contains(l)) breaks.push_back([l](Problem& q) { q.layout = l; });
    if (caps.head_dims[0] != 0) {
      breaks.push_back([](Problem& q) { q.head_dim = q.head_dim_v = q.head_dim + 8; });
    } else if (caps.max_head_dim < 4096) {
      breaks.push_back([&caps](Problem& q) { q.head_dim = caps.max_head_dim + 1 + q.data_seed % 64; });
    }
    if (caps.max_head_dim_v < 4096) breaks.push_back([&caps](Problem& q) { q.head_dim_v = caps.max_head_dim_v + 1; });
    if (caps.head_dim_v_equal) breaks.push_back([](Problem& q) { q.head_dim_v = q.head_dim + 1; });
    if (!caps.gqa) breaks.push_back([](Problem& q) { q.heads_kv = 1, q.heads_q = 4; });
    if (!caps.softcap) breaks.push_back([](Problem& q) { q.softcap = 30; });
    if (!caps.alibi) breaks.push_back([](Problem& q) { q.alibi = true; });
    if (caps.min_page_size == 0 || caps.min_page_size > 1)
      breaks.push_back([&caps](Problem& q) {
        q.pass = Pass::fwd;
        q.dout = Problem{}.dout;
        q.page_size = caps.min_page_size == 0 ? 16 : caps.min_page_size - 1;
      });
    if (!caps.varlen)
      breaks.push_back([](Problem& q) {
        q.lens_q.assign(q.batch, q.seqlen_q);
        q.lens_kv.assign(q.batch, q.seqlen_kv);
      });
    if (caps.seqlen_q_multiple > 1) breaks.push_back([&caps](Problem& q) { q.seqlen_q = caps.seqlen_q_multiple + 1; });
    if (caps.min_seqlen_q > 1)
      breaks.push_back([&caps](Problem& q) {
        q.seqlen_q = caps.min_seqlen_q - 1;
        q.lens_q.clear();
        q.lens_kv.clear();
      });
    if (caps.seqlen_kv_multiple > 1) breaks.push_back([&caps](Problem& q) { q.seqlen_kv = caps.seqlen_kv_multiple + 1; });
    if (!caps.empty_sequences)
      breaks.push_back([](Problem& q) {  // padded lengths would exceed the empty sequence: dropped
        q.seqlen_kv = 0;
        q.lens_q.clear();
        q.lens_kv.clear();
      });
    if (caps.aligned_masks_need_sq_le_skv && caps.masks.contains(MaskKind::causal_br))
      breaks.push_back([](Problem& q) {
        q.mask = MaskKind::causal_br;
        q.window_left = q.window_right = -1;
        q.lens_q.clear();
        q.lens_kv.clear();
        q.seqlen_q = q.seqlen_kv + 1;
      });
    if (!caps.nonfinite_inputs) breaks.push_back([](Problem& q) { q.values = ValueDist{ValueFamily::nan_inf, {0.01}}; });
    RC_PRE(!breaks.empty());
    const auto which = *rc::gen::inRange<std::size_t>(0, breaks.size());
    breaks[which](p);
    p.lens_q.resize(p.lens_q.empty() ? 0 : static_cast<std::size_t>(p.batch));
    RC_PRE(unsupported_reason(caps, p).has_value());  // really outside the domain
    try {
      validate(p);  // and still a well-formed problem
    } catch (const BadInput&) {
      RC_DISCARD("the out-of-domain change made the problem malformed");
    }
    return p;
  });
}

}  // namespace flashcheck
