#include <fmt/core.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "flashcheck/cli/commands.hpp"

namespace flashcheck::cli {

std::vector<Problem> read_problems(const std::vector<std::string>& lines, const std::string& file) {
  std::vector<Problem> problems;
  for (const auto& line : lines) problems.push_back(parse_problem(line));
  if (!file.empty()) {
    std::error_code error;
    const auto status = std::filesystem::status(file, error);
    if (status.type() == std::filesystem::file_type::not_found)
      throw std::invalid_argument(fmt::format("--problems '{}': no such file", file));
    if (std::filesystem::is_directory(status))
      throw std::invalid_argument(fmt::format("--problems '{}' is a folder; give a file of problem lines", file));
    std::ifstream stream(file);
    if (!stream) throw std::invalid_argument(fmt::format("--problems '{}': cannot read it", file));
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
  if (problems.empty())
    throw std::invalid_argument(file.empty() ? "no problem given: use --problem '<line>' or --problems FILE"
                                             : fmt::format("--problems '{}' holds no problem line", file));
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
        throw std::invalid_argument("'mutants': this binary links no mutant (flashcheck-testing does)");
      subjects.insert(subjects.end(), mutants.begin(), mutants.end());
      continue;
    }
    Subject* subject = Registry::instance().find(name);
    if (!subject) {
      // At most 80 characters of what was typed.
      const std::string shown = name.size() <= 80 ? name : name.substr(0, 80) + "...";
      throw std::invalid_argument(fmt::format("unknown subject '{}' (flashcheck list shows them)", shown));
    }
    subjects.push_back(subject);
  }
  return subjects;
}

void add_peer(CLI::App& command, std::vector<std::string>& names, bool& none) {
  command.add_option("--peer", names,
                     "The subjects compared with on every half-precision and fp8 case, the first whose domain\n"
                     "holds the case: its errors beside the subject's, its time beside the subject's in bench")
      ->delimiter(',')
      ->type_name("NAME,...")
      ->capture_default_str();
  command.add_flag("--no-peer", none,
                   "Compare with no peer: under compute-sanitizer, say, so that its findings are the subject's own");
}

std::vector<Subject*> resolve_peers(const std::vector<std::string>& names, bool none) {
  std::vector<Subject*> peers;
  if (none) return peers;
  ensure_external_registered();
  for (const std::string& name : names) {
    if (Subject* peer = Registry::instance().find(name)) {
      peers.push_back(peer);
      continue;
    }
    // A default peer not built in (a CPU build) is left out, as --no-peer.
    if (std::find(kDefaultPeers.begin(), kDefaultPeers.end(), name) != kDefaultPeers.end()) continue;
    const std::string shown = name.size() <= 80 ? name : name.substr(0, 80) + "...";
    throw std::invalid_argument(fmt::format("--peer: unknown subject '{}' (flashcheck list shows them)", shown));
  }
  return peers;
}

void print_subject_stats() {
  // The table above went to stdout, which is block-buffered when redirected:
  // flush it first, so that `2>&1` does not cut a stats line into a row.
  std::fflush(stdout);
  for (Subject* subject : Registry::instance().subjects())
    if (const std::string line = subject->stats(); !line.empty()) fmt::print(stderr, "stats: {}\n", line);
}

}  // namespace flashcheck::cli
