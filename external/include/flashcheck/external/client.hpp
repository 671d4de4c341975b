// The client side of one external worker: its process, its exchange folder
// and its request ids (WorkerClient), and the helpers the subject shares with
// it. Every failure is a WorkerFailure with the whole story in its message.
#pragma once

#include <fmt/format.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flashcheck/core/tensor.hpp"
#include "flashcheck/external/process.hpp"
#include "flashcheck/external/protocol.hpp"
#include "flashcheck/external/subject.hpp"

namespace flashcheck::external {

namespace fs = std::filesystem;

/// The .npy type string of a storage dtype: bf16 travels as its bit pattern
/// ('<u2'), as NumPy has no bfloat16.
std::string npy_descr(DType dtype);

/// A tensor's shape in storage order: [B, H, S, D] (bhsd) or [B, S, H, D] (bshd).
std::vector<std::int64_t> storage_shape(const HostTensor& t);

/// A reply's string field, or `otherwise` when it is missing or not a string
/// (a worker's reply is untrusted: a null or a number there must not throw).
std::string text_of(const nlohmann::json& reply, const char* key, const std::string& otherwise = "");

/// The last lines of a worker's stderr log, as "; its stderr ends: ..." ("" when empty).
std::string log_tail(const fs::path& log);

/// One worker process, its folder and its request ids. Every failure is a
/// WorkerFailure with the whole story in its message; after one the process
/// is gone and the next request starts a new one.
struct WorkerFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class WorkerClient {
 public:
  explicit WorkerClient(const WorkerSpec& spec) : spec_(spec) {
    std::string pattern = (fs::temp_directory_path() / fmt::format("flashcheck-{}-XXXXXX", spec.name)).string();
    if (!::mkdtemp(pattern.data())) throw std::runtime_error(fmt::format("cannot make a folder like {}", pattern));
    dir_ = pattern;
  }
  ~WorkerClient() {
    if (process_) process_->stop(5);
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }
  const fs::path& dir() const { return dir_; }
  fs::path log() const { return dir_ / "worker.log"; }

  /// Starts the worker (when it is not running) and returns its hello.
  nlohmann::json start() {
    if (process_) return hello_;
    try {
      process_ = std::make_unique<WorkerProcess>(spec_.command, spec_.cwd, log());
    } catch (const std::runtime_error& error) {
      throw WorkerFailure(error.what());
    }
    // The negotiation: "protocol" stays the oldest version, which a
    // version-1 worker checks and answers; "protocols" lists every version
    // this flashcheck speaks, and a newer worker answers the newest it shares.
    nlohmann::json versions = nlohmann::json::array();
    for (int version = kOldestProtocolVersion; version <= kProtocolVersion; ++version) versions.push_back(version);
    const nlohmann::json hello = {{"type", "hello"},
                                  {"protocol", kOldestProtocolVersion},
                                  {"protocols", versions},
                                  {"subject", spec_.name},
                                  {"flashcheck", "0.1.0"},
                                  {"dir", dir_.string()}};
    hello_ = exchange(hello, spec_.startup_seconds, "the handshake");
    const std::string type = text_of(hello_, "type");
    if (type == "error") fail(fmt::format("refused the handshake: {}", text_of(hello_, "message", cut(hello_.dump()))));
    if (type != "hello") fail(fmt::format("answered the handshake with {}", cut(hello_.dump())));
    const auto spoken = hello_.find("protocol");
    if (spoken == hello_.end() || !spoken->is_number_integer() || spoken->get<int>() < kOldestProtocolVersion ||
        spoken->get<int>() > kProtocolVersion)
      fail(fmt::format("speaks protocol {}, this flashcheck speaks {} to {}",
                       spoken != hello_.end() ? spoken->dump() : "(none)", kOldestProtocolVersion, kProtocolVersion));
    if (text_of(hello_, "subject") != spec_.name)
      fail(fmt::format("answered the handshake for subject {}, not '{}'",
                       hello_.contains("subject") ? hello_["subject"].dump() : "(none)", spec_.name));
    return hello_;
  }

  /// Sends a request and returns the worker's reply to it.
  nlohmann::json exchange(const nlohmann::json& request, double seconds, std::string_view what) {
    if (!process_) start();
    // One watchdog for the request, the reply and the reading of its files.
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    if (!process_->send(request.dump(), seconds))
      fail(fmt::format("could not be sent {} (it has gone, or did not read it within {:.0f} s)", what, seconds));
    std::string line;
    const double left = std::chrono::duration<double>(deadline_ - std::chrono::steady_clock::now()).count();
    switch (process_->receive(line, std::max(left, 0.0))) {
      case WorkerProcess::Wait::line: break;
      case WorkerProcess::Wait::timeout:
        fail(fmt::format("gave no reply to {} within {:.0f} s (watchdog): killed", what, seconds));
      case WorkerProcess::Wait::closed: fail(fmt::format("closed its output during {}", what));
      case WorkerProcess::Wait::too_long: fail(fmt::format("sent a line of over 1 MiB in reply to {}", what));
    }
    nlohmann::json reply = nlohmann::json::parse(line, nullptr, false);
    if (reply.is_discarded() || !reply.is_object())
      fail(fmt::format("sent a malformed reply to {} (not a JSON object): {}", what, cut(line)));
    return reply;
  }

  /// Sends a request under the next id ("case 3", "timing request 4") and
  /// returns the worker's result for it: a reply of another type or id is
  /// the worker's failure.
  nlohmann::json call(nlohmann::json request, double seconds, std::string_view what) {
    const std::int64_t id = ++next_id_;
    request["id"] = id;
    const std::string named = fmt::format("{} {}", what, id);
    nlohmann::json reply = exchange(request, seconds, named);
    if (text_of(reply, "type") != "result" || !reply.contains("id") || reply["id"] != id)
      fail(fmt::format("answered {} with {}", named, cut(reply.dump())));
    return reply;
  }

  /// When the last request's watchdog ends: its output files are read by then.
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }

  /// Kills the worker and throws the failure, with how it ended and its stderr.
  [[noreturn]] void fail(const std::string& what) {
    std::string ending;
    if (process_) {
      const auto ended = process_->ended(0.5);
      process_->kill();
      ending = ended ? fmt::format(" (the worker {})", *ended) : "";
      process_.reset();
    }
    throw WorkerFailure(fmt::format("external worker '{}' {}{}{}", spec_.name, what, ending, log_tail(log())));
  }

  static std::string cut(const std::string& text) { return text.size() > 200 ? text.substr(0, 200) + "..." : text; }

  /// Ends the worker; the next request starts a new one.
  void discard() {
    if (process_) process_->kill();
    process_.reset();
  }

 private:
  WorkerSpec spec_;
  fs::path dir_;
  std::unique_ptr<WorkerProcess> process_;
  nlohmann::json hello_;
  std::int64_t next_id_ = 0;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
};

}  // namespace flashcheck::external
