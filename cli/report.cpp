// `flashcheck report`: finds a Python with matplotlib and hands the records to
// reports/report.py, whose exit code it returns.
#include <fmt/core.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/core/process.hpp"

namespace flashcheck::cli {

namespace {

/// Runs argv (PATH searched) and waits; its exit status, or -1 when it could
/// not run or died of a signal. `quiet` sends its output to /dev/null. It
/// stays in this process's group, so that Ctrl-C at a terminal reaches it,
/// and dies with flashcheck.
int run_and_wait(const std::vector<std::string>& argv, bool quiet) {
  std::fflush(stdout);
  ProcessOptions options;
  options.argv = argv;
  options.own_group = false;
  if (quiet) {
    options.out = Redirect::null();
    options.err = Redirect::null();
  }
  try {
    Process child(options);
    const std::optional<ExitStatus> status = child.wait_for(-1);
    return status && status->exited() ? status->code() : -1;
  } catch (const ProcessError&) {
    return -1;
  }
}

/// $FLASHCHECK_PYTHON, else the first of python3 (PATH) and /usr/bin/python3
/// (Debian's, where python3-matplotlib installs) that imports matplotlib.
std::optional<std::string> find_python() {
  std::vector<std::string> candidates;
  if (const char* given = std::getenv("FLASHCHECK_PYTHON"); given && *given) candidates.emplace_back(given);
  candidates.emplace_back("python3");
  candidates.emplace_back("/usr/bin/python3");
  for (const std::string& python : candidates)
    if (run_and_wait({python, "-c", "import matplotlib"}, true) == 0) return python;
  return std::nullopt;
}

/// $FLASHCHECK_REPORT_SCRIPT, else the installed copy found from the binary
/// (<prefix>/bin/flashcheck -> ../share/flashcheck/reports/report.py, with
/// report.py's ../docs/record.schema.json beside it; cmake/FlashcheckInstall.cmake),
/// else reports/report.py in the source tree (a build tree's binary; cli/CMakeLists.txt).
std::string report_script() {
  if (const char* given = std::getenv("FLASHCHECK_REPORT_SCRIPT"); given && *given) return given;
  std::error_code error;
  const std::filesystem::path binary = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path installed = binary.parent_path() / FLASHCHECK_INSTALLED_REPORT_SCRIPT;
    if (std::filesystem::is_regular_file(installed, error)) return installed.string();
  }
  return FLASHCHECK_REPORT_SCRIPT;
}

}  // namespace

void add_report(CLI::App& app, int& exit_code) {
  auto paths = std::make_shared<std::vector<std::string>>();
  auto baseline = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto title = std::make_shared<std::string>("flashcheck report");
  CLI::App* command = app.add_subcommand(
      "report", "Records (run --record, fuzz --out, bench --record) -> OUTDIR/report.html, summary.md, summary.json");
  command->add_option("paths", *paths, "Records files, or folders searched for *.jsonl")->required();
  command->add_option("-o,--out", *out, "Output folder: report.html, summary.md, summary.json")->required();
  command->add_option("--baseline", *baseline,
                      "An earlier run's records (files or folders): regressions beyond noise are flagged (default: none)")
      ->expected(1, -1);
  command->add_option("--title", *title, "The report's title")->capture_default_str();
  command->footer(
      "Example: flashcheck report build/sweep10 bench.jsonl -o build/report --baseline reports/testdata/h200-2026-11-21\n"
      "Exit codes: report.py's: 0 written, 1 a regression beyond noise against --baseline, 2 bad input (no\n"
      "records, no Python with matplotlib); 3 internal error.");
  command->callback([=, &exit_code] {
    const std::string script = report_script();
    if (!std::filesystem::is_regular_file(script))
      throw std::invalid_argument(fmt::format("report: the report script {} is missing (set FLASHCHECK_REPORT_SCRIPT)", script));
    const std::optional<std::string> python = find_python();
    if (!python)
      throw std::invalid_argument("report: no Python with matplotlib (Debian: apt install python3-matplotlib; or set "
                                  "FLASHCHECK_PYTHON)");
    std::vector<std::string> argv = {*python, script};
    argv.insert(argv.end(), paths->begin(), paths->end());
    argv.insert(argv.end(), {"-o", *out, "--title", *title});
    if (!baseline->empty()) {
      argv.emplace_back("--baseline");
      argv.insert(argv.end(), baseline->begin(), baseline->end());
    }
    const int status = run_and_wait(argv, false);
    if (status < 0)  // report.py could not start, or died of a signal
      throw std::runtime_error(fmt::format("report: {} {} did not finish", *python, script));
    exit_code = status;
  });
}

}  // namespace flashcheck::cli
