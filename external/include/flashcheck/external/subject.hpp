// External subjects: an attention implementation in another program (a
// Python worker over PyTorch, Triton, JAX, a vendor library) checked like an
// in-tree kernel. flashcheck starts the program once as a worker process and
// speaks the protocol of docs/external-subjects.md with it: a handshake that
// declares the Capabilities, then one request per case with the inputs in
// .npy files, one reply with O and LSE in .npy files (or `unsupported`). A
// backward request (protocol 2) adds the handed O and LSE and dO to the
// inputs, and takes dQ, dK and dV back.
//
// A worker that crashes, hangs past the watchdog, answers garbage, or returns
// wrong shapes or dtypes makes that case a recorded `error` (never a harness
// crash); the worker is restarted for the next case.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "flashcheck/core/subject.hpp"
#include "flashcheck/external/protocol.hpp"

namespace flashcheck::external {

/// How to start one worker, and the subject name it serves.
struct WorkerSpec {
  std::string name;
  std::string command;        // split like a shell word list (wordexp), no shell operators
  std::filesystem::path cwd;  // empty: flashcheck's own
  double startup_seconds = 300;  // start-up and handshake deadline
  double watchdog_seconds = 0;   // per case; 0: 30 s + 1 s per 1e8 multiply-adds
};

class WorkerClient;

class ExternalSubject : public Subject {
 public:
  /// Starts the worker and shakes hands; throws std::runtime_error with the
  /// reason (the command does not run, wrong protocol, bad capabilities).
  explicit ExternalSubject(WorkerSpec spec);
  /// Takes a handshake already made by a parent process (registration()):
  /// the worker starts on the first call, and a failure to start is that
  /// call's error.
  ExternalSubject(WorkerSpec spec, const nlohmann::json& hello);
  ~ExternalSubject() override;

  std::string_view name() const override { return spec_.name; }
  std::string_view description() const override { return description_; }
  const Capabilities& capabilities() const override { return caps_; }
  std::string version_info() const override { return version_; }
  RunResult run(const Problem& problem, const Inputs& inputs) override;
  /// The backward through the worker (protocol 2): Q, K, V, the handed O and
  /// LSE, and dO in; dQ, dK and dV out, checked for dtype and shape as O is.
  BackwardResult run_backward(const Problem& problem, const BackwardInputs& inputs) override;
  std::optional<Timing> time(const Problem& problem, const Inputs& inputs, int warmup, int repeats,
                             int input_sets) override;
  /// The start-up limit plus the per-case limit's fixed part: a sweep's
  /// watchdog allows them, so that the worker's own watchdog fires first.
  double startup_seconds() const override;

  /// The spec and the handshake's answer, from which a child process
  /// registers the same subject without a handshake of its own.
  nlohmann::json registration() const;

 private:
  void adopt(const nlohmann::json& hello);
  WorkerSpec spec_;
  int protocol_ = kOldestProtocolVersion;  // the version the worker answered the handshake with
  nlohmann::json hello_;
  std::string description_, version_, deviations_;
  Capabilities caps_;
  std::unique_ptr<WorkerClient> client_;
};

/// Reads a config file: {"workers": [{"name", "cmd", optional "cwd" (relative
/// to the file's folder, which is the default), "startup_s", "watchdog_s"}]}.
/// Throws std::runtime_error naming the file and the entry.
std::vector<WorkerSpec> read_config(const std::filesystem::path& path);

/// Starts and registers each worker as a subject (a name already registered
/// is an error), and exports the registrations in FLASHCHECK_EXTERNAL_REGISTERED
/// so that child processes (the fuzz workers) register the same subjects.
void register_workers(const std::vector<WorkerSpec>& specs);

/// In a child process: registers what the parent exported. Also registers
/// the workers of the config file that FLASHCHECK_EXTERNAL names, if set.
void register_from_environment();

}  // namespace flashcheck::external
