#include "properties/generators.hpp"

#include <algorithm>

namespace flashcheck {

rc::Gen<std::int64_t> gen_seqlen(std::int64_t max) {
  std::vector<std::int64_t> edges;
  for (std::int64_t len : {0, 1, 2, 3, 7, 13, 16, 17, 31, 32, 33, 47}) edges.push_back(std::min(len, max));
  return rc::gen::weightedOneOf<std::int64_t>({
      {3, rc::gen::elementOf(edges)},
      {2, rc::gen::inRange<std::int64_t>(0, max + 1)},
  });
}

rc::Gen<ValueDist> gen_value_dist(bool allow_special_values) {
  using rc::gen::just;
  std::vector<std::pair<std::size_t, rc::Gen<ValueDist>>> choices = {
      {4, rc::gen::map(rc::gen::pair(rc::gen::inRange(-20, 21), rc::gen::inRange(1, 40)),
                       [](auto mean_std) {
                         return ValueDist{ValueFamily::normal, {mean_std.first / 10.0, mean_std.second / 10.0}};
                       })},
      {1, just(ValueDist{ValueFamily::uniform, {-1.0, 1.0}})},
      {1, just(ValueDist{ValueFamily::heavy, {3.0}})},
      {1, just(ValueDist{ValueFamily::outliers, {0.01, 100.0}})},
      {1, just(ValueDist{ValueFamily::sparse_int, {3.0, 0.5}})},
      {1, just(ValueDist{ValueFamily::near_overflow, {300.0, 0.25}})},
      {1, just(ValueDist{ValueFamily::subnormal, {}})},
      {1, just(ValueDist{ValueFamily::ties, {3.0}})},
      {1, rc::gen::map(rc::gen::elementOf(std::vector<double>{5.0, 17.5, 30.0, 90.0}),
                       [](double gap) { return ValueDist{ValueFamily::dominant, {gap}}; })},
      {1, just(ValueDist{ValueFamily::late_max, {16.0, 8.0}})},
  };
  if (allow_special_values) choices.push_back({1, just(ValueDist{ValueFamily::nan_inf, {0.002}})});
  // Weighted choice over a run-time list: repeat each generator `weight` times.
  // elementOf shrinks toward the front, i.e. toward plain normal values.
  std::vector<rc::Gen<ValueDist>> pool;
  for (const auto& [weight, generator] : choices) pool.insert(pool.end(), weight, generator);
  return rc::gen::join(rc::gen::elementOf(pool));
}

rc::Gen<Problem> gen_problem(const ProblemLimits& limits) {
  return rc::gen::exec([limits] {
    Problem p;
    p.batch = *rc::gen::inRange<std::int64_t>(1, limits.max_batch + 1);
    p.heads_kv = *rc::gen::inRange<std::int64_t>(1, limits.max_heads_kv + 1);
    const std::int64_t group = *rc::gen::elementOf(std::vector<std::int64_t>{1, 1, 2, 4, 8});
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
        {{3, rc::gen::elementOf(std::vector<std::int64_t>{1, 8, 16, 32, std::min<std::int64_t>(64, max_d)})},
         {1, rc::gen::inRange<std::int64_t>(1, max_d + 1)}});
    p.head_dim_v = *rc::gen::weightedOneOf<std::int64_t>(
        {{3, rc::gen::just(p.head_dim)}, {1, rc::gen::inRange<std::int64_t>(1, max_d + 1)}});
    p.dtype = *rc::gen::element(DType::f32, DType::f16, DType::bf16);
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
    p.geometry_seed = *rc::gen::arbitrary<std::uint64_t>();
    p.data_seed = *rc::gen::arbitrary<std::uint64_t>();
    return p;
  });
}

}  // namespace flashcheck
