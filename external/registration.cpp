// External subjects registered from a config file or from what a parent
// process exported (subject.hpp: read_config, register_workers,
// register_from_environment).
#include <stdlib.h>

#include <fmt/format.h>

#include <fstream>
#include <stdexcept>

#include "flashcheck/external/subject.hpp"

namespace flashcheck::external {

namespace fs = std::filesystem;

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
