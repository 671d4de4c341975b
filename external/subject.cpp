#include "external/subject.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "core/dtype.hpp"
#include "external/npy.hpp"
#include "external/process.hpp"

namespace flashcheck::external {

namespace fs = std::filesystem;

// ---- Capabilities and problems as JSON -----------------------------------

namespace {

constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr MaskKind kMasks[] = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window};
constexpr Layout kLayouts[] = {Layout::bhsd, Layout::bshd};

template <typename Enum, std::size_t N>
nlohmann::json names_of(const EnumSet<Enum>& set, const Enum (&all)[N]) {
  nlohmann::json names = nlohmann::json::array();
  for (Enum value : all)
    if (set.contains(value)) names.push_back(std::string(to_string(value)));
  return names;
}

template <typename Enum, std::size_t N>
EnumSet<Enum> set_of(const nlohmann::json& names, const Enum (&all)[N], std::string_view key) {
  if (!names.is_array()) throw std::runtime_error(fmt::format("capabilities.{}: expected a list of names", key));
  EnumSet<Enum> set;
  for (const auto& name : names) {
    bool found = false;
    for (Enum value : all)
      if (name.is_string() && to_string(value) == name.get<std::string>()) {
        set.insert(value);
        found = true;
      }
    if (!found) {
      std::string known;
      for (Enum value : all) known += fmt::format("{}{}", known.empty() ? "" : ", ", to_string(value));
      throw std::runtime_error(fmt::format("capabilities.{}: unknown name {} (known: {})", key, name.dump(), known));
    }
  }
  return set;
}

}  // namespace

nlohmann::json to_json(const Capabilities& c) {
  nlohmann::json j = {{"dtypes", names_of(c.dtypes, kDTypes)},
                      {"masks", names_of(c.masks, kMasks)},
                      {"layouts", names_of(c.layouts, kLayouts)},
                      {"min_head_dim", c.min_head_dim},
                      {"max_head_dim", c.max_head_dim},
                      {"max_head_dim_v", c.max_head_dim_v},
                      {"head_dim_v_equal", c.head_dim_v_equal},
                      {"gqa", c.gqa},
                      {"varlen", c.varlen},
                      {"lse", c.lse},
                      {"seqlen_q_multiple", c.seqlen_q_multiple},
                      {"seqlen_kv_multiple", c.seqlen_kv_multiple},
                      {"max_seqlen_q", c.max_seqlen_q},
                      {"max_seqlen_kv", c.max_seqlen_kv},
                      {"empty_sequences", c.empty_sequences},
                      {"nonfinite_inputs", c.nonfinite_inputs},
                      {"may_flush_subnormals", c.may_flush_subnormals},
                      {"tile_q", c.tile_q},
                      {"tile_kv", c.tile_kv},
                      {"needs_gpu", c.needs_gpu},
                      {"min_compute_capability", c.min_compute_capability},
                      {"known_deviations", std::string(c.known_deviations)}};
  if (c.head_dims[0] != 0) {
    j["head_dims"] = nlohmann::json::array();
    for (auto d : c.head_dims)
      if (d != 0) j["head_dims"].push_back(d);
  }
  if (c.compute_dtype) j["compute_dtype"] = std::string(to_string(*c.compute_dtype));
  return j;
}

Capabilities capabilities_from_json(const nlohmann::json& j, std::string& deviations) {
  if (!j.is_object()) throw std::runtime_error("capabilities: expected a JSON object");
  for (std::string_view required : {"dtypes", "masks"})
    if (!j.contains(required)) throw std::runtime_error(fmt::format("capabilities.{}: missing (required)", required));
  Capabilities c;
  for (const auto& [key, value] : j.items()) {
    // Each key is read with the type its field has; a wrong type or an
    // unknown key (a typo would otherwise widen or narrow the domain
    // silently) is an error naming it.
    const auto integer = [&](std::int64_t low, std::int64_t high) {
      if (!value.is_number_integer() || value.get<std::int64_t>() < low || value.get<std::int64_t>() > high)
        throw std::runtime_error(fmt::format("capabilities.{}: expected an integer in [{}, {}], got {}", key, low,
                                             high, value.dump()));
      return value.get<std::int64_t>();
    };
    const auto boolean = [&] {
      if (!value.is_boolean())
        throw std::runtime_error(fmt::format("capabilities.{}: expected true or false, got {}", key, value.dump()));
      return value.get<bool>();
    };
    constexpr std::int64_t kBig = std::numeric_limits<std::int32_t>::max();
    if (key == "dtypes") c.dtypes = set_of(value, kDTypes, key);
    else if (key == "masks") c.masks = set_of(value, kMasks, key);
    else if (key == "layouts") c.layouts = set_of(value, kLayouts, key);
    else if (key == "head_dims") {
      if (!value.is_array() || value.empty() || value.size() > c.head_dims.size())
        throw std::runtime_error(
            fmt::format("capabilities.head_dims: expected a list of 1 to {} head dims", c.head_dims.size()));
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_number_integer() || value[i].get<int>() < 1 || value[i].get<int>() > 1024)
          throw std::runtime_error(fmt::format("capabilities.head_dims: bad head dim {}", value[i].dump()));
        c.head_dims[i] = static_cast<std::int16_t>(value[i].get<int>());
      }
    } else if (key == "min_head_dim") c.min_head_dim = integer(1, 1024);
    else if (key == "max_head_dim") c.max_head_dim = integer(1, 1024);
    else if (key == "max_head_dim_v") c.max_head_dim_v = integer(1, 1024);
    else if (key == "head_dim_v_equal") c.head_dim_v_equal = boolean();
    else if (key == "gqa") c.gqa = boolean();
    else if (key == "varlen") c.varlen = boolean();
    else if (key == "lse") c.lse = boolean();
    else if (key == "seqlen_q_multiple") c.seqlen_q_multiple = integer(1, 1 << 16);
    else if (key == "seqlen_kv_multiple") c.seqlen_kv_multiple = integer(1, 1 << 16);
    else if (key == "max_seqlen_q") c.max_seqlen_q = integer(1, kBig);
    else if (key == "max_seqlen_kv") c.max_seqlen_kv = integer(1, kBig);
    else if (key == "empty_sequences") c.empty_sequences = boolean();
    else if (key == "nonfinite_inputs") c.nonfinite_inputs = boolean();
    else if (key == "may_flush_subnormals") c.may_flush_subnormals = boolean();
    else if (key == "tile_q") c.tile_q = integer(1, 1 << 16);
    else if (key == "tile_kv") c.tile_kv = integer(1, 1 << 16);
    else if (key == "needs_gpu") c.needs_gpu = boolean();
    else if (key == "min_compute_capability") c.min_compute_capability = static_cast<int>(integer(0, 1000));
    else if (key == "compute_dtype") {
      const auto dtype = value.is_string() ? parse_dtype(value.get<std::string>()) : std::nullopt;
      if (!dtype) throw std::runtime_error(fmt::format("capabilities.compute_dtype: unknown dtype {}", value.dump()));
      c.compute_dtype = dtype;
    } else if (key == "known_deviations") {
      if (!value.is_string()) throw std::runtime_error("capabilities.known_deviations: expected a string");
      deviations = value.get<std::string>();
    } else {
      throw std::runtime_error(fmt::format("capabilities: unknown key '{}' (docs/external-subjects.md lists them)", key));
    }
  }
  if (c.dtypes.empty()) throw std::runtime_error("capabilities.dtypes: empty (the worker accepts nothing)");
  if (c.masks.empty()) throw std::runtime_error("capabilities.masks: empty (the worker accepts nothing)");
  if (c.layouts.empty()) throw std::runtime_error("capabilities.layouts: empty (the worker accepts nothing)");
  if (c.min_head_dim > c.max_head_dim)
    throw std::runtime_error(fmt::format("capabilities: min_head_dim {} > max_head_dim {}", c.min_head_dim,
                                         c.max_head_dim));
  c.known_deviations = deviations;
  return c;
}

nlohmann::json problem_fields(const Problem& p) {
  nlohmann::json j = {{"batch", p.batch},
                      {"heads_q", p.heads_q},
                      {"heads_kv", p.heads_kv},
                      {"seqlen_q", p.seqlen_q},
                      {"seqlen_kv", p.seqlen_kv},
                      {"lens_q", p.lens_q},
                      {"lens_kv", p.lens_kv},
                      {"head_dim", p.head_dim},
                      {"head_dim_v", p.head_dim_v},
                      {"dtype", std::string(to_string(p.dtype))},
                      {"layout", std::string(to_string(p.layout))},
                      {"mask", std::string(to_string(p.mask))},
                      {"window_left", p.window_left},
                      {"window_right", p.window_right},
                      {"softmax_scale", p.softmax_scale}};
  if (p.lens_q.empty()) j["lens_q"] = nullptr;
  if (p.lens_kv.empty()) j["lens_kv"] = nullptr;
  return j;
}

// ---- The worker client ---------------------------------------------------

namespace {

/// The .npy type string of a storage dtype: bf16 travels as its bit pattern
/// ('<u2'), as NumPy has no bfloat16.
std::string npy_descr(DType dtype) { return dtype == DType::f32 ? "<f4" : dtype == DType::f16 ? "<f2" : "<u2"; }

/// A tensor's shape in storage order: [B, H, S, D] (bhsd) or [B, S, H, D] (bshd).
std::vector<std::int64_t> storage_shape(const HostTensor& t) {
  return t.layout() == Layout::bhsd ? std::vector<std::int64_t>{t.batch(), t.heads(), t.seqlen(), t.dim()}
                                    : std::vector<std::int64_t>{t.batch(), t.seqlen(), t.heads(), t.dim()};
}

/// A reply's string field, or `otherwise` when it is missing or not a string
/// (a worker's reply is untrusted: a null or a number there must not throw).
std::string text_of(const nlohmann::json& reply, const char* key, const std::string& otherwise = "") {
  const auto found = reply.find(key);
  return found != reply.end() && found->is_string() ? found->get<std::string>() : otherwise;
}

std::string log_tail(const fs::path& log) {
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  std::string tail;
  for (std::size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i)
    tail += (tail.empty() ? "" : " | ") + lines[i].substr(0, 300);
  return tail.empty() ? std::string() : fmt::format("; its stderr ends: {}", tail);
}

}  // namespace

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
    const nlohmann::json hello = {{"type", "hello"},
                                  {"protocol", kProtocolVersion},
                                  {"subject", spec_.name},
                                  {"flashcheck", "0.1.0"},
                                  {"dir", dir_.string()}};
    hello_ = exchange(hello, spec_.startup_seconds, "the handshake");
    const std::string type = text_of(hello_, "type");
    if (type == "error") fail(fmt::format("refused the handshake: {}", text_of(hello_, "message", cut(hello_.dump()))));
    if (type != "hello") fail(fmt::format("answered the handshake with {}", cut(hello_.dump())));
    if (!hello_.contains("protocol") || hello_["protocol"] != kProtocolVersion)
      fail(fmt::format("speaks protocol {}, this flashcheck speaks {}",
                       hello_.contains("protocol") ? hello_["protocol"].dump() : "(none)", kProtocolVersion));
    if (text_of(hello_, "subject") != spec_.name)
      fail(fmt::format("answered the handshake for subject {}, not '{}'",
                       hello_.contains("subject") ? hello_["subject"].dump() : "(none)", spec_.name));
    return hello_;
  }

  /// Sends a request and returns the worker's reply to it.
  nlohmann::json exchange(const nlohmann::json& request, double seconds, std::string_view what) {
    if (!process_) start();
    if (!process_->send(request.dump())) fail(fmt::format("could not be sent {} (it has gone)", what));
    std::string line;
    switch (process_->receive(line, seconds)) {
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
};

// ---- The subject ---------------------------------------------------------

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
    const NpyArray o = read_npy(client_->dir() / "o.npy");
    HostTensor& out = result.outputs.o;
    if (o.descr != npy_descr(problem.dtype) || o.shape != storage_shape(out))
      throw WorkerFailure(fmt::format("external worker '{}' returned O as '{}' {}, but the problem needs '{}' {} ({}{})",
                                      spec_.name, o.descr, shape_text(o.shape), npy_descr(problem.dtype),
                                      shape_text(storage_shape(out)), to_string(problem.dtype),
                                      problem.dtype == DType::bf16 ? " as its bit pattern" : ""));
    std::copy(o.bytes.begin(), o.bytes.end(), static_cast<char*>(out.data()));
    if (caps_.lse) {
      const NpyArray lse = read_npy(client_->dir() / "lse.npy");
      const std::vector<std::int64_t> want{problem.batch, problem.heads_q, problem.seqlen_q};
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

// ---- Registration ----------------------------------------------------------

std::vector<WorkerSpec> read_config(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot read external config '{}'", path.string()));
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, false);
  if (config.is_discarded()) throw std::runtime_error(fmt::format("{}: not valid JSON", path.string()));
  if (!config.is_object() || !config.contains("workers") || !config["workers"].is_array())
    throw std::runtime_error(fmt::format("{}: expected {{\"workers\": [...]}}", path.string()));
  const fs::path folder = fs::absolute(path).parent_path();
  std::vector<WorkerSpec> specs;
  for (const auto& entry : config["workers"]) {
    const std::string where = fmt::format("{}: workers[{}]", path.string(), specs.size());
    if (!entry.is_object()) throw std::runtime_error(fmt::format("{}: expected an object", where));
    for (const auto& [key, value] : entry.items())
      if (key != "name" && key != "cmd" && key != "cwd" && key != "startup_s" && key != "watchdog_s")
        throw std::runtime_error(fmt::format("{}: unknown key '{}' (name, cmd, cwd, startup_s, watchdog_s)", where, key));
    WorkerSpec spec;
    if (!entry.contains("name") || !entry["name"].is_string() || !entry.contains("cmd") || !entry["cmd"].is_string())
      throw std::runtime_error(fmt::format("{}: needs \"name\" and \"cmd\" strings", where));
    spec.name = entry["name"];
    spec.command = entry["cmd"];
    spec.cwd = entry.contains("cwd") ? folder / entry["cwd"].get<std::string>() : folder;
    for (const auto& [key, field] : {std::pair{"startup_s", &spec.startup_seconds}, std::pair{"watchdog_s", &spec.watchdog_seconds}})
      if (entry.contains(key)) {
        if (!entry[key].is_number() || entry[key].get<double>() <= 0)
          throw std::runtime_error(fmt::format("{}: {} must be a positive number of seconds", where, key));
        *field = entry[key].get<double>();
      }
    specs.push_back(std::move(spec));
  }
  if (specs.empty()) throw std::runtime_error(fmt::format("{}: lists no worker", path.string()));
  return specs;
}

namespace {

constexpr const char* kRegisteredVariable = "FLASHCHECK_EXTERNAL_REGISTERED";

/// Hands a subject to the registry. Callers check the name first, before
/// they start its worker.
void add_to_registry(std::unique_ptr<ExternalSubject> subject) {
  auto holder = std::make_shared<std::unique_ptr<Subject>>(std::move(subject));
  Registry::instance().add([holder] { return std::move(*holder); });
  Registry::instance().subjects();  // constructed now, in registration order
}

void export_registrations() {
  nlohmann::json all = nlohmann::json::array();
  for (Subject* subject : Registry::instance().subjects())
    if (const auto* external = dynamic_cast<const ExternalSubject*>(subject))
      all.push_back(external->registration());
  ::setenv(kRegisteredVariable, all.dump().c_str(), 1);
}

}  // namespace

void register_workers(const std::vector<WorkerSpec>& specs) {
  for (const WorkerSpec& spec : specs) {
    if (spec.name.empty() || spec.name.find_first_of(" \t\n,") != std::string::npos)
      throw std::runtime_error(fmt::format("external subject name '{}': needs a name without spaces or commas", spec.name));
    if (Registry::instance().find(spec.name))
      throw std::runtime_error(fmt::format("external subject '{}': the name is taken by a registered subject", spec.name));
    add_to_registry(std::make_unique<ExternalSubject>(spec));
  }
  export_registrations();
}

void register_from_environment() {
  if (const char* text = std::getenv(kRegisteredVariable); text && *text) {
    const nlohmann::json all = nlohmann::json::parse(text, nullptr, false);
    if (all.is_discarded() || !all.is_array())
      throw std::runtime_error(fmt::format("{} is not a JSON list", kRegisteredVariable));
    for (const auto& entry : all) {
      WorkerSpec spec;
      spec.name = entry.at("name");
      spec.command = entry.at("cmd");
      spec.cwd = entry.at("cwd").get<std::string>();
      spec.startup_seconds = entry.at("startup_s");
      spec.watchdog_seconds = entry.at("watchdog_s");
      if (!Registry::instance().find(spec.name))
        add_to_registry(std::make_unique<ExternalSubject>(spec, entry.at("hello")));
    }
  }
  if (const char* config = std::getenv("FLASHCHECK_EXTERNAL"); config && *config) {
    std::vector<WorkerSpec> specs = read_config(config);
    std::erase_if(specs, [](const WorkerSpec& spec) { return Registry::instance().find(spec.name) != nullptr; });
    register_workers(specs);
  }
}

}  // namespace flashcheck::external
