// Properties of the Problem line: it round-trips, and the parser survives any
// input (random strings and mutations of valid lines) with either a Problem or
// a BadInput naming a field, never a crash or another exception.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <string>

#include "core/problem.hpp"
#include "generators/generators.hpp"

namespace flashcheck {
namespace {

// Parses a line; asserts that it either throws BadInput with a field name or
// returns a valid Problem whose printed form parses back to itself.
void assert_parses_safely(const std::string& line) {
  try {
    const Problem parsed = parse_problem(line);
    RC_ASSERT(parse_problem(to_line(parsed)) == parsed);
    RC_CLASSIFY(true, "parsed");
  } catch (const BadInput& error) {
    RC_ASSERT(!error.field().empty());
    RC_ASSERT(std::string(error.what()).find('\n') == std::string::npos);
    RC_CLASSIFY(true, "rejected");
  }
}

rc::Gen<std::string> gen_line_noise() {
  // Characters the grammar uses, plus arbitrary bytes.
  static const std::string alphabet = "bhqkvsdlen_tyrmaiwgocfpu=,() 0123456789.-+eExX\t";
  return rc::gen::oneOf(rc::gen::container<std::string>(rc::gen::elementOf(alphabet)),
                        rc::gen::arbitrary<std::string>());
}

// One random edit of a string: delete a range, insert noise, truncate, or
// duplicate a slice.
std::string mutate(std::string line) {
  const auto size = static_cast<int>(line.size());
  const int kind = *rc::gen::inRange(0, 4);
  const int at = size > 0 ? *rc::gen::inRange(0, size) : 0;
  const int length = *rc::gen::inRange(0, 12);
  switch (kind) {
    case 0: return line.erase(static_cast<std::size_t>(at), static_cast<std::size_t>(length));
    case 1: return line.insert(static_cast<std::size_t>(at), *gen_line_noise());
    case 2: return line.substr(0, static_cast<std::size_t>(at));
    default: return line.insert(static_cast<std::size_t>(at), line.substr(static_cast<std::size_t>(at), length));
  }
}

RC_GTEST_PROP(ProblemLine, RoundTripsThroughItsPrintedForm, (const Problem& problem)) {
  RC_CLASSIFY(true, to_string(problem.dtype));
  RC_CLASSIFY(true, to_string(problem.mask));
  RC_CLASSIFY(problem.padded(), "padded");
  const std::string line = to_line(problem);
  const Problem parsed = parse_problem(line);
  RC_ASSERT(parsed == problem);
  RC_ASSERT(to_line(parsed) == line);
}

RC_GTEST_PROP(ProblemLine, ParserSurvivesRandomStrings, ()) { assert_parses_safely(*gen_line_noise()); }

RC_GTEST_PROP(ProblemLine, ParserSurvivesMutatedLines, (const Problem& problem)) {
  std::string line = to_line(problem);
  const int edits = *rc::gen::inRange(1, 4);
  for (int e = 0; e < edits; ++e) line = mutate(line);
  assert_parses_safely(line);
}

}  // namespace
}  // namespace flashcheck
