// The sweep's records: what an earlier run left (resume), durable appends,
// and a case's record from its worker's reply (crash and timeout included).
#include <fcntl.h>
#include <unistd.h>

#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <rapidcheck.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include "flashcheck/core/record.hpp"
#include "flashcheck/fuzz/sweep_parts.hpp"
#include "flashcheck/judge/judge.hpp"
#include "worker_pool.hpp"

namespace flashcheck::fuzz::detail {

namespace fs = std::filesystem;


double number(const nlohmann::json& record, const char* key) {
  const auto found = record.find(key);
  return found != record.end() && found->is_number() ? found->get<double>() : 0.0;
}

Recorded read_records(const fs::path& path) {
  Recorded done;
  if (!fs::exists(path)) return done;
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t good = 0, start = 0;
  while (start < text.size()) {
    const std::size_t end = text.find('\n', start);
    if (end == std::string::npos) break;  // torn: no newline
    const std::string_view line(text.data() + start, end - start);
    if (nlohmann::json::parse(line.begin(), line.end(), nullptr, false).is_discarded()) break;  // torn
    Record read;
    try {
      read = parse_record(line);
    } catch (const RecordError& error) {  // whole, but not a record this build reads: never cut off
      throw std::invalid_argument(fmt::format(
          "fuzz: {} line {}: {} (a sweep of another flashcheck version? give a new --out)", path.string(),
          std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(start), '\n') + 1, error.what()));
    }
    if (const auto* record = std::get_if<CaseRecord>(&read)) {
      if (!record->case_key.empty()) done.cases.insert(record->case_key);
      if (record->failed() && !record->subject.empty()) done.failed_subjects.insert(record->subject);
      if (record->failed() && !record->case_key.empty()) done.failed_cases.insert(record->case_key);
    }
    good = end + 1;
    start = end + 1;
  }
  if (good < text.size()) fs::resize_file(path, good);
  return done;
}

void append_durably(const fs::path& path, const std::string& line) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("fuzz: cannot open {}: {}", path.string(), std::strerror(errno)));
  const std::string text = line + "\n";
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw std::runtime_error(fmt::format("fuzz: cannot write {}: {}", path.string(), std::strerror(errno)));
}

/// A case's record from its worker's reply (a crash or timeout record when it
/// gave none). The worker's judge record names the case already; what a
/// crash, a timeout or a worker error leaves out is filled in here.
CaseRecord record_of(const Worker::Reply& reply, const std::string& key, const Subject& subject,
                     const Problem& problem) {
  CaseRecord record;
  if (reply.outcome == Worker::Outcome::record) {
    std::string why;
    try {
      Record read = parse_record(reply.line);
      if (auto* case_record = std::get_if<CaseRecord>(&read)) record = std::move(*case_record);
      else why = "the worker wrote a record that is not a case";
    } catch (const RecordError& error) {
      why = fmt::format("the worker wrote a line that is not a record ({})", error.what());
    }
    if (!why.empty()) {
      record = CaseRecord{};
      record.verdict = CaseVerdict::error;
      record.check = "error";
      record.message = why;
    }
  } else {
    const bool timed_out = reply.outcome == Worker::Outcome::timed_out;
    record.verdict = timed_out ? CaseVerdict::timeout : CaseVerdict::crash;
    record.check = timed_out ? "timeout" : "crash";
    record.message = reply.how;
  }
  record.case_key = key;
  if (record.subject.empty()) record.subject = subject.name();
  if (record.problem.empty()) record.problem = to_line(problem);
  if (record.reproducer.empty()) record.reproducer = replay_command(subject.name(), problem);
  return record;
}

}  // namespace flashcheck::fuzz::detail
