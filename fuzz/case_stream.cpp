// The sweep's case stream: which subject and problem case k of a seed is,
// drawn from the subject's generator so that any case can be drawn without
// the ones before it (shards, resume), and the request line a worker reads.
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "flashcheck/fuzz/fuzz.hpp"
#include "flashcheck/fuzz/sweep_parts.hpp"
#include "flashcheck/generators/generators.hpp"

namespace flashcheck::fuzz {

void parse_shard(const std::string& text, int& shard, int& shards) {
  const std::size_t slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("");
    std::size_t used = 0;
    shard = std::stoi(text.substr(0, slash), &used);
    if (used != slash) throw std::invalid_argument("");
    shards = std::stoi(text.substr(slash + 1), &used);
    if (used != text.size() - slash - 1) throw std::invalid_argument("");
  } catch (const std::exception&) {
    throw std::invalid_argument(fmt::format("--shard '{}': expected i/n, e.g. 0/4", text));
  }
  if (shards < 1 || shard < 0 || shard >= shards)
    throw std::invalid_argument(fmt::format("--shard '{}': need 0 <= i < n", text));
}

namespace detail {

/// A 64-bit mix of (seed, k) (splitmix64's finaliser): spreads subjects over cases.
std::uint64_t mix(std::uint64_t seed, std::int64_t k) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(k) + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Case k has its own RapidCheck random state, so any case can be drawn without
// the ones before it (shards, resume). A draw the generator discards (an
// RC_PRE inside it) is redrawn with the next salt.
rc::Shrinkable<Problem> draw_problem(const Subject& subject, std::uint64_t seed, std::int64_t k, int size,
                                     double backward_share) {
  const rc::Gen<Problem> gen = gen_problem_in(
      subject.capabilities(), {.long_contexts = true,
                               .use_geometry_pool = false,
                               .backward_share = backward_share,
                               .softcap = true,
                               .alibi = true,
                               .paged = true});
  if (size < 0) size = static_cast<int>(k * 37 % 101);  // RapidCheck's size: 0 (small) to 100
  for (std::uint64_t salt = 0; salt < 1000; ++salt) {
    const rc::Random random(rc::Random::Key{seed, static_cast<std::uint64_t>(k), 0x666c617368636865ull, salt});
    try {
      rc::Shrinkable<Problem> drawn = gen(random, size);
      drawn.value();  // a discard throws here
      return drawn;
    } catch (const rc::detail::CaseResult&) {  // discarded
    } catch (const rc::GenerationFailure&) {
    }
  }
  throw std::runtime_error(fmt::format("fuzz: {}'s generator discarded 1000 draws for case {}", subject.name(), k));
}

double watchdog_for(const Problem& p, double fixed) {
  if (fixed > 0) return fixed;
  const double work = static_cast<double>(p.batch * p.heads_q) * static_cast<double>(p.seqlen_q) *
                      static_cast<double>(p.seqlen_kv) * static_cast<double>(p.head_dim + p.head_dim_v);
  return 60.0 + work / 1e7;
}

std::string request(const std::string& key, const Subject& subject, const Problem& problem) {
  return fmt::format("{}\t{}\t{}", key, subject.name(), to_line(problem));
}

}  // namespace detail
}  // namespace flashcheck::fuzz
