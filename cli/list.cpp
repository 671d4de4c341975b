// `flashcheck list`: the registered subjects and their domains, as text or,
// with --json, as one JSON document (capabilities in the external protocol's
// form, external/subject.hpp's to_json, so that a tool reads one schema).
#include <fmt/core.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/external/subject.hpp"

namespace flashcheck::cli {

namespace {

struct ListOptions {
  std::vector<std::string> names;  // -s: only these (names, 'all', 'mutants')
  bool json = false;
};

/// Whether -s chose the subject (every one when -s was not given).
bool chosen(const std::vector<Subject*>& only, bool filtered, const Subject* subject) {
  return !filtered || std::find(only.begin(), only.end(), subject) != only.end();
}

void print_json(const std::vector<Subject*>& only, bool filtered, const GpuInventory& gpus) {
  Registry& registry = Registry::instance();
  nlohmann::json subjects = nlohmann::json::array();
  const auto add = [&](const std::vector<Subject*>& list, std::string_view kind) {
    for (Subject* subject : list) {
      if (!chosen(only, filtered, subject)) continue;
      nlohmann::json entry = {{"name", std::string(subject->name())},
                              {"kind", std::string(kind)},
                              {"description", std::string(subject->description())},
                              {"in_all", kind == "subject"},
                              {"capabilities", external::to_json(subject->capabilities())}};
      const auto why = unavailable_reason(subject->capabilities(), gpus);
      entry["available"] = !why.has_value();
      if (why) entry["unavailable_reason"] = *why;
      subjects.push_back(std::move(entry));
    }
  };
  add(registry.subjects(), "subject");
  add(registry.smoke_tests(), "smoke");
  add(registry.mutants(), "mutant");
  add(registry.fixtures(), "fixture");
  nlohmann::json devices = nlohmann::json::array();
  for (const GpuDevice& gpu : gpus.devices)
    devices.push_back({{"index", gpu.index},
                       {"name", gpu.name},
                       {"compute_capability", gpu.compute_capability},
                       {"multiprocessors", gpu.multiprocessors},
                       {"memory_gib", gpu.memory_gib}});
  nlohmann::json document = {{"subjects", std::move(subjects)}, {"gpus", std::move(devices)}};
  if (gpus.devices.empty()) document["gpu_note"] = gpus.note;
  fmt::print("{}\n", document.dump(2));
}

void print_text(const std::vector<Subject*>& only, bool filtered, const GpuInventory& gpus) {
  Registry& registry = Registry::instance();
  std::vector<Subject*> subjects;
  for (Subject* subject : registry.subjects())
    if (chosen(only, filtered, subject)) subjects.push_back(subject);
  fmt::print("{} subject(s):\n", subjects.size());
  for (Subject* subject : subjects) {
    fmt::print("  {:<20} {}\n", subject->name(), subject->description());
    fmt::print("  {:<20} {}\n", "", describe(subject->capabilities()));
    // With a GPU present, say which subjects it cannot run (too old for them).
    if (!gpus.devices.empty())
      if (auto why = unavailable_reason(subject->capabilities(), gpus))
        fmt::print("  {:<20} UNAVAILABLE here: {}\n", "", *why);
  }
  // flashcheck-testing links mutants and fixtures too.
  const auto print_names = [&](std::string_view what, const std::vector<Subject*>& all) {
    std::vector<Subject*> list;
    for (Subject* subject : all)
      if (chosen(only, filtered, subject)) list.push_back(subject);
    if (list.empty()) return;
    fmt::print("{} {}(s):\n", list.size(), what);
    for (Subject* subject : list) fmt::print("  {:<28} {}\n", subject->name(), subject->description());
  };
  // Smoke tests exercise the pipeline but cannot fail on accuracy: listed
  // apart, marked, and never in `all`.
  std::vector<Subject*> smoke;
  for (Subject* subject : registry.smoke_tests())
    if (chosen(only, filtered, subject)) smoke.push_back(subject);
  if (!smoke.empty())
    fmt::print("{} smoke test(s), not in 'all' (judged against themselves: they check the pipeline, not accuracy):\n",
               smoke.size());
  for (Subject* subject : smoke) {
    fmt::print("  {:<20} [smoke] {}\n", subject->name(), subject->description());
    fmt::print("  {:<20} {}\n", "", describe(subject->capabilities()));
  }
  print_names("mutant", registry.mutants());
  print_names("fixture", registry.fixtures());
  if (gpus.devices.empty()) fmt::print("GPU: none ({}); GPU subjects are unavailable here (not run, not tested)\n", gpus.note);
  for (const GpuDevice& gpu : gpus.devices)
    fmt::print("GPU {}: {} (sm_{}, {} SMs, {:.0f} GiB)\n", gpu.index, gpu.name, gpu.compute_capability,
               gpu.multiprocessors, gpu.memory_gib);
}

}  // namespace

void add_list(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<ListOptions>();
  auto* command = app.add_subcommand("list", "Print the registered subjects and their capability domains");
  add_subjects(*command, options->names)
      ->description(std::string(kSubjectsHelp) + "\n(default: every subject, smoke test, mutant and fixture)");
  command->add_flag("--json", options->json,
                    "Print one JSON document instead: {\"subjects\": [{\"name\", \"kind\" (subject, smoke, mutant,\n"
                    "fixture), \"description\", \"in_all\", \"capabilities\" (the external protocol's form,\n"
                    "docs/external-subjects.md), \"available\", \"unavailable_reason\"}], \"gpus\": [...]}");
  command->footer(fmt::format("Example: flashcheck list --json -s cpu-plain\n{}", kExitCodesLine));
  command->callback([options, &exit_code] {
    const bool filtered = !options->names.empty();
    const std::vector<Subject*> only = filtered ? resolve_subjects(options->names) : std::vector<Subject*>{};
    if (!filtered) ensure_external_registered();
    const GpuInventory gpus = gpu_devices();
    if (options->json) print_json(only, filtered, gpus);
    else print_text(only, filtered, gpus);
    exit_code = kExitPass;
  });
}

}  // namespace flashcheck::cli
