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
  caps_ = capabilities_from_json(hello.contains("capabilities") ? hello["capabilities"] : nlohmann::json(),
                                 deviations_);
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

double watchdog_for(const WorkerSpec& spec, const Problem& p) {
  if (spec.watchdog_seconds > 0) return spec.watchdog_seconds;
  const double work = static_cast<double>(p.batch * p.heads_q) * static_cast<double>(p.seqlen_q) *
                      static_cast<double>(p.seqlen_kv) * static_cast<double>(p.head_dim + p.head_dim_v);
  return kCaseSeconds + work / 1e8;
}

/// The request for one case (its id comes with WorkerClient::call), its
/// inputs written to the worker's folder.
nlohmann::json make_request(const Problem& p, const Inputs& in, const fs::path& dir) {
  nlohmann::json request = {{"type", "run"}, {"problem", to_line(p)}, {"shape", problem_fields(p)}};
  for (const auto& [key, tensor] : {std::pair{"q", &in.q}, std::pair{"k", &in.k}, std::pair{"v", &in.v}}) {
    const fs::path path = dir / fmt::format("{}.npy", key);
    write_npy(path, npy_descr(tensor->dtype()), storage_shape(*tensor), tensor->data(),
              static_cast<std::size_t>(tensor->bytes()));
    request["inputs"][key] = path.string();
  }
  request["outputs"] = {{"o", (dir / "o.npy").string()}, {"lse", (dir / "lse.npy").string()}};
  return request;
}

}  // namespace

double ExternalSubject::startup_seconds() const {
  return spec_.startup_seconds + (spec_.watchdog_seconds > 0 ? spec_.watchdog_seconds : kCaseSeconds);
}

RunResult ExternalSubject::run(const Problem& problem, const Inputs& inputs) {
  if (auto refusal = refuse_outside(caps_, problem)) return *refusal;
  RunResult result;
  bool retire = false;
  try {
    std::error_code ignored;
    fs::remove(client_->dir() / "o.npy", ignored);
    fs::remove(client_->dir() / "lse.npy", ignored);
    const nlohmann::json reply =
        client_->call(make_request(problem, inputs, client_->dir()), watchdog_for(spec_, problem), "case");
    // A worker that cannot go on (a sticky CUDA error) says so with
    // "fatal": true; it is replaced before the next case.
    if (reply.contains("fatal") && reply["fatal"] == true) retire = true;
    const std::string status = text_of(reply, "status");
    if (status == "unsupported") {
      result.status = Status::unsupported;
      result.message = fmt::format("{} (the worker's answer)", text_of(reply, "reason", "no reason given"));
      if (retire) client_->discard();
      return result;
    }
    if (status == "error") {
      result.status = Status::error;
      result.message = fmt::format("external worker '{}' reported an error{}: {}", spec_.name,
                                   retire ? " and retired" : "", text_of(reply, "message", "no message given"));
      if (retire) client_->discard();
      return result;
    }
    if (status != "ok")
      client_->fail(fmt::format("answered case {} with status {} (expected ok, unsupported or error)",
                                reply["id"].dump(), reply.contains("status") ? reply["status"].dump() : "(none)"));
    // The outputs: exactly the dtype and shape the problem asks for.
    result.outputs = make_outputs(problem);
    HostTensor& out = result.outputs.o;
    // Read under the reply's watchdog, and refused by its size before reading
    // past 8 bytes an element (a wrong dtype still gets its own message).
    const NpyArray o = read_npy(client_->dir() / "o.npy",
                                {static_cast<std::uintmax_t>(out.size()) * 8, client_->deadline()});
    if (o.descr != npy_descr(problem.dtype) || o.shape != storage_shape(out))
      throw WorkerFailure(fmt::format("external worker '{}' returned O as '{}' {}, but the problem needs '{}' {} ({}{})",
                                      spec_.name, o.descr, shape_text(o.shape), npy_descr(problem.dtype),
                                      shape_text(storage_shape(out)), to_string(problem.dtype),
                                      problem.dtype == DType::bf16 ? " as its bit pattern" : ""));
    std::copy(o.bytes.begin(), o.bytes.end(), static_cast<char*>(out.data()));
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
    if (retire) client_->discard();
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

std::optional<Timing> ExternalSubject::time(const Problem& problem, const Inputs& inputs, int warmup, int repeats,
                                            int input_sets) {
  if (auto reason = unsupported_reason(caps_, problem)) throw std::invalid_argument(*reason);
  nlohmann::json request = make_request(problem, inputs, client_->dir());
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
