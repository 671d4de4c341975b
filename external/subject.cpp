#include "flashcheck/external/subject.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include "flashcheck/core/dtype.hpp"
#include "flashcheck/external/client.hpp"
#include "flashcheck/external/npy.hpp"

namespace flashcheck::external {

ExternalSubject::ExternalSubject(WorkerSpec spec) : spec_(std::move(spec)) {
  client_ = std::make_unique<WorkerClient>(spec_);
  nlohmann::json hello;
  try {
    hello = client_->start();
  } catch (const WorkerFailure& error) {
    throw std::runtime_error(error.what());
  }
  try {
    adopt(hello);
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(fmt::format("external worker '{}': {}", spec_.name, error.what()));
  }
}

ExternalSubject::ExternalSubject(WorkerSpec spec, const nlohmann::json& hello) : spec_(std::move(spec)) {
  client_ = std::make_unique<WorkerClient>(spec_);
  adopt(hello);
}

ExternalSubject::~ExternalSubject() = default;

void ExternalSubject::adopt(const nlohmann::json& hello) {
  hello_ = hello;
  // A handshake that a parent process made was checked there (client.hpp).
  const auto spoken = hello.find("protocol");
  protocol_ = spoken != hello.end() && spoken->is_number_integer() ? spoken->get<int>() : kOldestProtocolVersion;
  caps_ = capabilities_from_json(hello.contains("capabilities") ? hello["capabilities"] : nlohmann::json(),
                                 deviations_, protocol_);
  description_ = hello.contains("description") && hello["description"].is_string()
                     ? hello["description"].get<std::string>()
                     : "external worker";
  description_ += fmt::format(" [external: {}]", spec_.command);
  version_ = hello.contains("version") && hello["version"].is_string() ? hello["version"].get<std::string>() : "";
}

nlohmann::json ExternalSubject::registration() const {
  return {{"name", spec_.name},
          {"cmd", spec_.command},
          {"cwd", spec_.cwd.string()},
          {"startup_s", spec_.startup_seconds},
          {"watchdog_s", spec_.watchdog_seconds},
          {"hello", hello_}};
}

namespace {

constexpr double kCaseSeconds = 30;  // the per-case limit's fixed part
/// The backward's work against the forward's: the FLOP convention of
/// cuDNN's and flash-attention's benchmarks (issue 22, item 6).
constexpr double kBackwardWork = 2.5;

double watchdog_for(const WorkerSpec& spec, const Problem& p) {
  if (spec.watchdog_seconds > 0) return spec.watchdog_seconds;
  const double work = static_cast<double>(p.batch * p.heads_q) * static_cast<double>(p.seqlen_q) *
                      static_cast<double>(p.seqlen_kv) * static_cast<double>(p.head_dim + p.head_dim_v);
  return kCaseSeconds + work * (p.pass == Pass::bwd ? kBackwardWork : 1.0) / 1e8;
}

/// Writes one input tensor to the worker's folder as `file` (default: the
/// key's name) and names it in the request.
void add_input(nlohmann::json& request, const fs::path& dir, const char* key, const HostTensor& tensor,
               const char* file = nullptr) {
  const fs::path path = dir / fmt::format("{}.npy", file ? file : key);
  write_npy(path, npy_descr(tensor.dtype()), storage_shape(tensor), tensor.data(),
            static_cast<std::size_t>(tensor.bytes()));
  request["inputs"][key] = path.string();
}

/// The request for one case (its id comes with WorkerClient::call), its
/// inputs written to the worker's folder. A version-1 worker gets exactly
/// the version-1 request; from version 2 on it names its pass.
nlohmann::json make_request(const Problem& p, const Inputs& in, const fs::path& dir, int protocol) {
  nlohmann::json request = {{"type", "run"}, {"problem", to_line(p)}, {"shape", problem_fields(p)}};
  if (protocol >= 2) request["pass"] = std::string(to_string(p.pass));
  add_input(request, dir, "q", in.q);
  add_input(request, dir, "k", in.k);
  add_input(request, dir, "v", in.v);
  if (in.pages.paged()) {  // K and V are the pools; the table maps each sequence's pages into them
    request["shape"]["pages"] = in.pages.pages;
    request["shape"]["pages_per_sequence"] = in.pages.per_sequence;
    const fs::path table = dir / "page_table.npy";
    write_npy(table, "<i4", {p.batch, in.pages.per_sequence}, in.pages.entries.data(),
              in.pages.entries.size() * sizeof(std::int32_t));
    request["inputs"]["page_table"] = table.string();
  }
  if (p.pass == Pass::fwd) {
    request["outputs"] = {{"o", (dir / "o.npy").string()}, {"lse", (dir / "lse.npy").string()}};
  } else {
    request["outputs"] = {
        {"dq", (dir / "dq.npy").string()}, {"dk", (dir / "dk.npy").string()}, {"dv", (dir / "dv.npy").string()}};
  }
  return request;
}

/// The backward's request: the forward's inputs, then the O and LSE the
/// subject is handed (core/backward.hpp) and dO. The handed O and LSE have
/// files of their own, apart from the forward's outputs o.npy and lse.npy.
nlohmann::json make_backward_request(const Problem& p, const BackwardInputs& in, const fs::path& dir, int protocol) {
  nlohmann::json request = make_request(p, in.inputs, dir, protocol);
  add_input(request, dir, "o", in.forward.o, "handed_o");
  const std::vector<std::int64_t> lse_shape{p.batch, p.heads_q, p.seqlen_q};
  const fs::path lse = dir / "handed_lse.npy";
  write_npy(lse, "<f4", lse_shape, in.forward.lse.data(), in.forward.lse.size() * sizeof(float));
  request["inputs"]["lse"] = lse.string();
  add_input(request, dir, "do", in.dout);
  return request;
}

/// Reads one output a worker wrote into `out`, which has the dtype and shape
/// the problem asks for; anything else is the worker's failure. Read under
/// the reply's watchdog, and refused by its size before reading past 8
/// bytes an element (a wrong dtype still gets its own message).
void read_output(const WorkerClient& client, const std::string& subject, const char* what, const char* file,
                 HostTensor& out) {
  const NpyArray array =
      read_npy(client.dir() / file, {static_cast<std::uintmax_t>(out.size()) * 8, client.deadline()});
  if (array.descr != npy_descr(out.dtype()) || array.shape != storage_shape(out))
    throw WorkerFailure(fmt::format("external worker '{}' returned {} as '{}' {}, but the problem needs '{}' {} ({}{})",
                                    subject, what, array.descr, shape_text(array.shape), npy_descr(out.dtype()),
                                    shape_text(storage_shape(out)), to_string(out.dtype()),
                                    out.dtype() == DType::bf16 ? " as its bit pattern" : ""));
  std::copy(array.bytes.begin(), array.bytes.end(), static_cast<char*>(out.data()));
}

/// What a reply's status says, when it is not `ok`: the case's result
/// status and message (nullopt for ok). Any other status is the worker's
/// failure. A worker that cannot go on ("fatal": true, a sticky CUDA error)
/// is replaced before the next case.
std::optional<std::pair<Status, std::string>> not_ok(WorkerClient& client, const std::string& subject,
                                                     const nlohmann::json& reply) {
  const bool retire = reply.contains("fatal") && reply["fatal"] == true;
  const std::string status = text_of(reply, "status");
  std::optional<std::pair<Status, std::string>> answer;
  if (status == "unsupported")
    answer.emplace(Status::unsupported,
                   fmt::format("{} (the worker's answer)", text_of(reply, "reason", "no reason given")));
  else if (status == "error")
    answer.emplace(Status::error, fmt::format("external worker '{}' reported an error{}: {}", subject,
                                              retire ? " and retired" : "", text_of(reply, "message", "no message given")));
  else if (status != "ok")
    client.fail(fmt::format("answered case {} with status {} (expected ok, unsupported or error)", reply["id"].dump(),
                            reply.contains("status") ? reply["status"].dump() : "(none)"));
  if (retire && answer) client.discard();
  return answer;
}

}  // namespace

double ExternalSubject::startup_seconds() const {
  return spec_.startup_seconds + (spec_.watchdog_seconds > 0 ? spec_.watchdog_seconds : kCaseSeconds);
}

RunResult ExternalSubject::run(const Problem& problem, const Inputs& inputs) {
  if (auto refusal = refuse_outside(caps_, problem)) return *refusal;
  RunResult result;
  try {
    std::error_code ignored;
    fs::remove(client_->dir() / "o.npy", ignored);
    fs::remove(client_->dir() / "lse.npy", ignored);
    const nlohmann::json reply = client_->call(make_request(problem, inputs, client_->dir(), protocol_),
                                               watchdog_for(spec_, problem), "case");
    if (auto answer = not_ok(*client_, spec_.name, reply)) {
      result.status = answer->first;
      result.message = answer->second;
      return result;
    }
    // The outputs: exactly the dtype and shape the problem asks for.
    result.outputs = make_outputs(problem);
    read_output(*client_, spec_.name, "O", "o.npy", result.outputs.o);
    if (caps_.lse) {
      const std::vector<std::int64_t> want{problem.batch, problem.heads_q, problem.seqlen_q};
      const NpyArray lse = read_npy(client_->dir() / "lse.npy",
                                    {static_cast<std::uintmax_t>(want[0] * want[1] * want[2]) * 8, client_->deadline()});
      if (lse.descr != "<f4" || lse.shape != want)
        throw WorkerFailure(fmt::format("external worker '{}' returned LSE as '{}' {}, but the problem needs '<f4' {}",
                                        spec_.name, lse.descr, shape_text(lse.shape), shape_text(want)));
      std::copy(lse.bytes.begin(), lse.bytes.end(), reinterpret_cast<char*>(result.outputs.lse.data()));
      result.outputs.has_lse = true;
    } else {
      result.outputs.has_lse = false;
    }
    if (reply.contains("time_ms") && reply["time_ms"].is_number()) result.time_ms = reply["time_ms"].get<double>();
    if (reply.contains("fatal") && reply["fatal"] == true) client_->discard();
  } catch (const WorkerFailure& error) {  // the worker is handled: killed, or kept in step
    result = RunResult{};
    result.status = Status::error;
    result.message = error.what();
  } catch (const std::exception& error) {  // anything else a reply caused (a .npy that does not parse, ...)
    client_->discard();
    result = RunResult{};
    result.status = Status::error;
    result.message = fmt::format("external worker '{}': {} (worker restarted)", spec_.name, error.what());
  }
  return result;
}

BackwardResult ExternalSubject::run_backward(const Problem& problem, const BackwardInputs& inputs) {
  if (auto refusal = refuse_backward_outside(caps_, problem)) return *refusal;
  BackwardResult result;
  try {
    std::error_code ignored;
    for (const char* file : {"dq.npy", "dk.npy", "dv.npy"}) fs::remove(client_->dir() / file, ignored);
    const nlohmann::json reply = client_->call(make_backward_request(problem, inputs, client_->dir(), protocol_),
                                               watchdog_for(spec_, problem), "backward case");
    if (auto answer = not_ok(*client_, spec_.name, reply)) {
      result.status = answer->first;
      result.message = answer->second;
      return result;
    }
    // dK and dV per K/V head: a worker that returns them per query head (the
    // GQA sum not done) is refused by their shape.
    result.gradients = make_gradients(problem);
    read_output(*client_, spec_.name, "dQ", "dq.npy", result.gradients.dq);
    read_output(*client_, spec_.name, "dK", "dk.npy", result.gradients.dk);
    read_output(*client_, spec_.name, "dV", "dv.npy", result.gradients.dv);
    if (reply.contains("time_ms") && reply["time_ms"].is_number()) result.time_ms = reply["time_ms"].get<double>();
    if (reply.contains("fatal") && reply["fatal"] == true) client_->discard();
  } catch (const WorkerFailure& error) {
    result = BackwardResult{};
    result.status = Status::error;
    result.message = error.what();
  } catch (const std::exception& error) {
    client_->discard();
    result = BackwardResult{};
    result.status = Status::error;
    result.message = fmt::format("external worker '{}': {} (worker restarted)", spec_.name, error.what());
  }
  return result;
}

std::optional<Timing> ExternalSubject::time(const Problem& problem, const Inputs& inputs, int warmup, int repeats,
                                            int input_sets) {
  if (auto reason = unsupported_reason(caps_, problem)) throw std::invalid_argument(*reason);
  // A timing request carries the forward's inputs only: Subject::time has no dO.
  if (problem.pass == Pass::bwd)
    throw std::invalid_argument("timing a worker's backward is not in the protocol (Subject::time takes no dO)");
  nlohmann::json request = make_request(problem, inputs, client_->dir(), protocol_);
  request["timing"] = {{"warmup", warmup}, {"repeats", repeats}, {"input_sets", input_sets}};
  const nlohmann::json reply =
      client_->call(std::move(request), watchdog_for(spec_, problem) * (1 + warmup + repeats), "timing request");
  if (text_of(reply, "status") == "unsupported")
    throw std::invalid_argument(fmt::format("the worker: {}", text_of(reply, "reason", "unsupported")));
  if (text_of(reply, "status") != "ok")
    throw std::runtime_error(fmt::format("external worker '{}': {}", spec_.name, WorkerClient::cut(reply.dump())));
  const auto& times = reply.contains("times_ms") ? reply["times_ms"] : nlohmann::json();
  if (!times.is_array() || static_cast<int>(times.size()) != repeats)
    throw std::runtime_error(fmt::format("external worker '{}' returned times_ms {} for {} repeats", spec_.name,
                                         WorkerClient::cut(times.dump()), repeats));
  std::vector<float> samples;
  for (const auto& t : times) {
    if (!t.is_number() || !(t.get<double>() > 0))
      throw std::runtime_error(fmt::format("external worker '{}' returned a time of {}", spec_.name, t.dump()));
    samples.push_back(t.get<float>());
  }
  return summarise(std::move(samples));
}

}  // namespace flashcheck::external
