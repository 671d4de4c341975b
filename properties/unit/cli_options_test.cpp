// The command line as a whole (cli/app.cpp builds it): every option of every
// command has a description, every command's footer has an example and the
// exit codes, the subject option is the same everywhere, and an error's exit
// code says whether it was bad input (2) or an internal error (3).
#include <gtest/gtest.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashcheck/cli/commands.hpp"

namespace flashcheck::cli {
namespace {

/// Every command and subcommand of the app, hidden ones included, with its path ("external run").
std::vector<std::pair<std::string, CLI::App*>> every_command(CLI::App& app) {
  std::vector<std::pair<std::string, CLI::App*>> commands;
  const std::function<void(const std::string&, CLI::App*)> walk = [&](const std::string& path, CLI::App* command) {
    for (CLI::App* sub : command->get_subcommands({})) {
      const std::string name = path.empty() ? sub->get_name() : path + " " + sub->get_name();
      commands.emplace_back(name, sub);
      walk(name, sub);
    }
  };
  walk("", &app);
  return commands;
}

struct CliApp : testing::Test {
  CLI::App app{"flashcheck"};
  int exit_code = 0;
  CliApp() { add_commands(app, exit_code); }
};

TEST_F(CliApp, EveryOptionOfEveryCommandHasADescription) {
  const auto commands = every_command(app);
  ASSERT_GE(commands.size(), 8u);  // list, run, bench-oracle, bench, fuzz, replay, report, external (and more)
  int options = 0;
  for (const auto& [name, command] : commands)
    for (const CLI::Option* option : command->get_options()) {
      ++options;
      EXPECT_FALSE(option->get_description().empty()) << "flashcheck " << name << " " << option->get_name()
                                                      << ": no description";
    }
  EXPECT_GT(options, 60) << "the walk found too few options to be the whole command line";
}

TEST_F(CliApp, EveryVisibleCommandHasAnExampleAndTheExitCodesInItsFooter) {
  for (const auto& [name, command] : every_command(app)) {
    if (command->get_group().empty()) continue;  // hidden: fuzz-worker, the sweep's own process
    const std::string footer = command->get_footer();
    EXPECT_NE(footer.find("Example: flashcheck"), std::string::npos) << "flashcheck " << name << ":\n" << footer;
    EXPECT_NE(footer.find("Exit codes"), std::string::npos) << "flashcheck " << name << ":\n" << footer;
    EXPECT_NE(footer.find("3 internal"), std::string::npos) << "flashcheck " << name << ":\n" << footer;
  }
}

TEST_F(CliApp, EveryCommandThatTakesSubjectsTakesThemTheSameWay) {
  int with_subjects = 0;
  std::string help;
  for (const auto& [name, command] : every_command(app)) {
    const CLI::Option* option = command->get_option_no_throw("--subjects");
    const bool takes = option != nullptr || command->get_option_no_throw("--subject") != nullptr;
    if (!takes) continue;
    ++with_subjects;
    ASSERT_NE(option, nullptr) << "flashcheck " << name << " has --subject but not --subjects";
    EXPECT_TRUE(option->check_sname("s")) << name;
    EXPECT_TRUE(option->check_lname("subject")) << name << ": the older spelling is kept";
    EXPECT_EQ(option->get_delimiter(), ',') << name << ": comma lists";
    // The same help everywhere, but for a sentence about the command's default.
    const std::string text = option->get_description().substr(0, std::string(kSubjectsHelp).size());
    EXPECT_EQ(text, kSubjectsHelp) << name;
  }
  // run, bench, fuzz, replay, list, and each again under external.
  EXPECT_EQ(with_subjects, 10);
}

TEST_F(CliApp, CommaListsAndRepeatsCollectEverySubject) {
  CLI::App* run = app.get_subcommand("run");
  run->callback(nullptr);  // parse only
  app.parse("run -s c --subject b,a --subjects d", false);
  EXPECT_EQ(run->get_option("--subjects")->results(), (std::vector<std::string>{"c", "b", "a", "d"}));
}

int code_of(const std::function<void()>& thrower, std::string* line) {
  testing::internal::CaptureStderr();
  int code = -1;
  try {
    thrower();
  } catch (...) {
    code = exit_code_of(std::current_exception());
  }
  *line = testing::internal::GetCapturedStderr();
  return code;
}

TEST(CliExitCode, BadInputIsTwoAndAnythingElseIsThreeWithOneLine) {
  std::string line;
  EXPECT_EQ(code_of([] { throw BadInput("hq", "must be positive"); }, &line), kExitBadInput);
  EXPECT_EQ(line, "flashcheck: bad problem: hq: must be positive\n");
  EXPECT_EQ(code_of([] { throw std::invalid_argument("unknown subject 'x'"); }, &line), kExitBadInput);
  EXPECT_EQ(line, "flashcheck: unknown subject 'x'\n");
  EXPECT_EQ(code_of([] { throw CLI::ValidationError("--minutes", "'nan' is not a finite number"); }, &line), kExitBadInput);
  EXPECT_NE(line.find("--minutes"), std::string::npos) << line;
  EXPECT_EQ(code_of([] { throw std::runtime_error("cannot fork:\nno memory"); }, &line), kExitInternalError);
  EXPECT_EQ(line, "flashcheck: internal error: cannot fork: no memory\n");
  EXPECT_EQ(code_of([] { throw std::out_of_range("vector::at"); }, &line), kExitInternalError);
  EXPECT_EQ(line, "flashcheck: internal error: vector::at\n");
  EXPECT_EQ(code_of([] { throw 42; }, &line), kExitInternalError);
  EXPECT_EQ(line, "flashcheck: internal error: an exception of unknown type\n");
}

}  // namespace
}  // namespace flashcheck::cli
