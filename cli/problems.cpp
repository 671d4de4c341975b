#include <fmt/core.h>

#include <fstream>
#include <stdexcept>

#include "cli/commands.hpp"

namespace flashcheck::cli {

std::vector<Problem> read_problems(const std::vector<std::string>& lines, const std::string& file) {
  std::vector<Problem> problems;
  for (const auto& line : lines) problems.push_back(parse_problem(line));
  if (!file.empty()) {
    std::ifstream stream(file);
    if (!stream) throw std::runtime_error(fmt::format("cannot read problems file '{}'", file));
    std::string line;
    for (int number = 1; std::getline(stream, line); ++number) {
      const auto first = line.find_first_not_of(" \t\r");
      if (first == std::string::npos || line[first] == '#') continue;
      try {
        problems.push_back(parse_problem(line));
      } catch (const BadInput& error) {
        throw BadInput(error.field(), error.reason(), fmt::format("{}:{}", file, number));
      }
    }
  }
  if (problems.empty()) throw std::runtime_error("no problem given: use --problem '<line>' or --problems FILE");
  return problems;
}

std::vector<Subject*> resolve_subjects(const std::vector<std::string>& names, bool* every) {
  ensure_external_registered();
  std::vector<Subject*> subjects;
  if (every) *every = false;
  for (const auto& name : names) {
    if (name == "all") {
      if (every) *every = true;
      for (Subject* subject : Registry::instance().subjects()) subjects.push_back(subject);
      continue;
    }
    if (name == "mutants") {  // in binaries that link kernels/mutants (flashcheck-testing)
      const auto& mutants = Registry::instance().mutants();
      if (mutants.empty())
        throw std::runtime_error("'mutants': this binary links no mutant (flashcheck-testing does)");
      subjects.insert(subjects.end(), mutants.begin(), mutants.end());
      continue;
    }
    Subject* subject = Registry::instance().find(name);
    if (!subject) throw std::runtime_error(fmt::format("unknown subject '{}' (flashcheck list shows them)", name));
    subjects.push_back(subject);
  }
  return subjects;
}

void print_subject_stats() {
  for (Subject* subject : Registry::instance().subjects())
    if (const std::string line = subject->stats(); !line.empty()) fmt::print(stderr, "stats: {}\n", line);
}

}  // namespace flashcheck::cli
