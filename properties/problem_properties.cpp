// Properties of the Problem line: it round-trips, and the parser survives any
// input (random strings and mutations of valid lines) with either a Problem or
// a BadInput naming a field, never a crash or another exception; through the
// CLI, an invalid line gives one line on stderr and exit code 2.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "flashcheck/core/values.hpp"  // generate_inputs
#include "flashcheck/core/problem.hpp"
#include "flashcheck/generators/generators.hpp"
#include "properties/cli_runner.hpp"

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

// A refusal reads as one short printable line: no newline, no control byte
// (a NUL would cut it short), nothing near the size of a huge token.
void assert_clean_refusal(const BadInput& error) {
  const std::string message = error.what();
  RC_ASSERT(!error.field().empty());
  RC_ASSERT(message.size() <= 512u);
  RC_ASSERT(std::all_of(message.begin(), message.end(), [](char c) { return c >= 0x20 && c < 0x7f; }));
}

// Numbers that a parser converting instead of refusing would turn into a
// crash (sparse_int(1e19,1) and ties(1e300) died of SIGFPE, issue 21) or a
// silent wrap.
const std::vector<std::string>& hostile_numbers() {
  static const std::vector<std::string> numbers = {
      "1e19", "-1e19", "1e300", "-1e300", "1e400", "1e-400", "99999999999999999999", "-9223372036854775809",
      "9223372036854775807", "18446744073709551616", "4294967296", "2147483648", "9007199254740993", "nan", "-nan",
      "inf", "-inf", "NaN", "0x10", "-0", "0", "1e15"};
  return numbers;
}

// The [first, last) byte ranges of the space-separated tokens of a line.
std::vector<std::pair<std::size_t, std::size_t>> token_spans(const std::string& line) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  std::size_t at = 0;
  while (at < line.size()) {
    while (at < line.size() && line[at] == ' ') ++at;
    const std::size_t first = at;
    while (at < line.size() && line[at] != ' ') ++at;
    if (at > first) spans.emplace_back(first, at);
  }
  return spans;
}

// One hostile edit of a valid line: a flipped bit, a token deleted or
// duplicated, a number replaced by a hostile one (anywhere, or as a value
// family's parameter), a NUL byte, a very long token, or one of the edits of
// `mutate`. Never a newline: a problem line is
// one line (a newline is a line break in a file, whitespace on the command line).
std::string mutate_hostile(std::string line) {
  const auto spans = token_spans(line);
  const int kind = *rc::gen::inRange(0, 8);
  const auto size = static_cast<int>(line.size());
  const auto at = static_cast<std::size_t>(size > 0 ? *rc::gen::inRange(0, size) : 0);
  switch (kind) {
    case 0:
      if (!line.empty()) line[at] = static_cast<char>(line[at] ^ (1 << *rc::gen::inRange(0, 8)));
      break;
    case 1:
    case 2:
      if (!spans.empty()) {
        const auto [first, last] = spans[static_cast<std::size_t>(*rc::gen::inRange(0, static_cast<int>(spans.size())))];
        if (kind == 1) line.erase(first, last - first);
        else line.insert(last, " " + line.substr(first, last - first));
      }
      break;
    case 3: {  // the first run of digits at or after `at` becomes a hostile number
      const std::size_t digit = line.find_first_of("0123456789", at);
      if (digit == std::string::npos) break;
      const std::size_t end = std::min(line.find_first_not_of("0123456789.e-", digit), line.size());
      line.replace(digit, end - digit, *rc::gen::elementOf(hostile_numbers()));
      break;
    }
    case 4: line.insert(at, 1, '\0'); break;
    case 6: {  // the values token becomes a family with a hostile parameter
      const std::size_t first = line.find("values=");
      if (first == std::string::npos) break;
      const std::size_t last = std::min(line.find(' ', first), line.size());
      const std::string family = *rc::gen::elementOf(std::vector<std::string>{
          "sparse_int({},0.5)", "ties({})", "late_max({},8)", "heavy({})", "normal(0.5,{})", "near_overflow({},0.5)",
          "dominant({})", "offset({})", "outliers(0.5,{})", "uniform(-1,{})", "nan_inf({})"});
      line.replace(first, last - first,
                   "values=" + fmt::format(fmt::runtime(family), *rc::gen::elementOf(hostile_numbers())));
      break;
    }
    case 5:  // a long token, alone or glued to what is there
      line.insert(at, std::string(static_cast<std::size_t>(*rc::gen::inRange(81, 16 * 1024)),
                                  *rc::gen::elementOf(std::string("7a=(,.e-"))));
      break;
    default: line = mutate(line); break;
  }
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line;
}

// A valid line with one to four hostile edits.
rc::Gen<std::string> gen_hostile_line() {
  return rc::gen::exec([] {
    std::string line = to_line(*rc::gen::arbitrary<Problem>());
    const int edits = *rc::gen::inRange(1, 5);
    for (int e = 0; e < edits; ++e) line = mutate_hostile(line);
    return line;
  });
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

// Every hostile mutation is either a valid problem (which round-trips, and
// whose inputs, when small, are drawn without a crash: the generator converts
// some parameters to integers) or a BadInput that reads as one clean line.
// Any other exception fails the property (RapidCheck reports it).
RC_GTEST_PROP(ProblemLine, HostileMutationsAreAProblemOrOneCleanBadInput, ()) {
  const std::string line = *gen_hostile_line();
  try {
    const Problem parsed = parse_problem(line);
    RC_ASSERT(parse_problem(to_line(parsed)) == parsed);
    const bool small = estimated_memory_bytes(parsed) < 16.0 * (1 << 20);
    if (small) generate_inputs(parsed);
    RC_CLASSIFY(true, "accepted", small ? "inputs drawn" : "too large to draw", to_string(parsed.values.family));
  } catch (const BadInput& error) {
    assert_clean_refusal(error);
    RC_CLASSIFY(true, "refused");
  }
}

// Every value family with a parameter of any magnitude, on a small problem:
// refused with a clean BadInput, or accepted and its inputs drawn without a
// crash (sparse_int(1e19,1) and ties(1e300) were accepted, then divided by
// zero in the generator: SIGFPE, issue 21).
RC_GTEST_PROP(ProblemLine, AValueParameterOfAnyMagnitudeIsRefusedOrDrawn, ()) {
  const std::string family = *rc::gen::elementOf(std::vector<std::string>{
      "sparse_int({},1)", "sparse_int(-{},0.5)", "ties({})", "late_max({},8)", "heavy({})", "normal({},1)",
      "near_overflow({},0.5)", "dominant({})", "offset({})", "outliers(0.5,{})", "uniform(-1,{})", "nan_inf({})"});
  const double power = *rc::gen::inRange(0, 310);
  const std::string number =
      *rc::gen::oneOf(rc::gen::elementOf(hostile_numbers()),
                      rc::gen::just(fmt::format("{}", std::pow(10.0, power) * *rc::gen::inRange(1, 10))));
  const std::string line = "b=1 hq=2 sq=5 skv=7 d=8 dtype=bf16 values=" + fmt::format(fmt::runtime(family), number);
  try {
    generate_inputs(parse_problem(line));
    RC_CLASSIFY(true, "drawn");
  } catch (const BadInput& error) {
    assert_clean_refusal(error);
    RC_CLASSIFY(true, "refused");
  }
}

// Through the binary: an invalid hostile line, in a problems file and (when
// it holds no NUL, which argv cannot carry) on the command line, gives exit
// code 2 and exactly one line on stderr, the file's one starting with
// FILE:LINE. A process per invalid line: the budget is RapidCheck's default
// of 100 lines, about 1.5 runs each.
RC_GTEST_PROP(ProblemLine, ThroughTheCliAnInvalidLineGivesOneLineAndExitTwo, ()) {
  const std::string line = *gen_hostile_line();
  try {
    parse_problem(line);
    RC_CLASSIFY(true, "valid (not run)");
    return;
  } catch (const BadInput&) {
  }
  const std::size_t first = line.find_first_not_of(" \t\r");
  if (first == std::string::npos || line[first] == '#') {  // a problems file skips it as blank or a comment
    RC_CLASSIFY(true, "blank or comment (not run)");
    return;
  }
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("flashcheck_problem_cli_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const auto problems = dir / "line.problems";
  std::ofstream(problems, std::ios::binary) << line << "\n";
  const auto run = [&](const std::string& problem_args) {
    const testing_cli::Outcome outcome =
        testing_cli::run_binary(FLASHCHECK_BINARY, "run -s smoke-cpu-lowp " + problem_args, dir, "", 60);
    return std::pair{outcome.exit_code, outcome.err};
  };
  const auto [file_code, file_err] = run("--problems " + problems.string());
  // argv carries no NUL, and one argument at most 128 KiB.
  const bool on_command_line = line.find('\0') == std::string::npos && line.size() < 100 * 1024;
  std::pair<int, std::string> from_command_line;
  if (on_command_line) from_command_line = run(fmt::format("--problem=\"$(cat {})\"", problems.string()));
  std::filesystem::remove_all(dir);
  RC_ASSERT(file_code == 2);
  RC_ASSERT(std::count(file_err.begin(), file_err.end(), '\n') == 1);
  RC_ASSERT(file_err.rfind(fmt::format("flashcheck: {}:1: bad problem: ", problems.string()), 0) == 0);
  RC_CLASSIFY(on_command_line, "also on the command line");
  if (!on_command_line) return;
  const auto& [line_code, line_err] = from_command_line;
  RC_ASSERT(line_code == 2);
  RC_ASSERT(std::count(line_err.begin(), line_err.end(), '\n') == 1);
  RC_ASSERT(line_err.rfind("flashcheck: bad problem: ", 0) == 0);
}

}  // namespace
}  // namespace flashcheck
