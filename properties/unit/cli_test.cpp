// The flashcheck binary: verdicts, exit codes (0 pass, 1 fail, 2 bad input or
// unsupported), one clear line per bad input, and records.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace flashcheck {
namespace {

struct Outcome {
  int exit_code = -1;
  std::string out, err;
};

std::filesystem::path scratch_dir() {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("flashcheck_cli_test_" + std::to_string(::getpid()) + "_" +
                    testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir;
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// Runs flashcheck with the given (shell-quoted) arguments, with a time limit so
// that a hang fails the test instead of stalling the suite.
Outcome flashcheck(const std::string& args) {
  const auto dir = scratch_dir();
  const std::string command = "timeout 120 " FLASHCHECK_BINARY " " + args + " >" + (dir / "out").string() + " 2>" +
                              (dir / "err").string() + " </dev/null";
  const int status = std::system(command.c_str());
  Outcome outcome;
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  outcome.out = slurp(dir / "out");
  outcome.err = slurp(dir / "err");
  return outcome;
}

int count_lines(const std::string& text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

const char* kGqaCausalLine = "b=2 hq=8 hkv=2 sq=128 skv=192 d=64 dtype=bf16 mask=causal_br values=normal(0.5,1) dseed=4";

TEST(CliTest, ListShowsTheCpuSubject) {
  const Outcome r = flashcheck("list");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cpu-lowp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("masks=none,causal_tl,causal_br,window"), std::string::npos) << r.out;
}

TEST(CliTest, RunPrintsMetricsAndAPassVerdict) {
  const Outcome r = flashcheck(std::string("run --subject cpu-lowp --problem '") + kGqaCausalLine + "'");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("o.max_abs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lse.rmse"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: PASS"), std::string::npos) << r.out;
}

TEST(CliTest, RunPrintsAVacuousCaseAsVacuousAndExitsZero) {
  // Every row fully masked (no key): nothing compared, so never PASS, and no failure either.
  const Outcome full = flashcheck("run --subject cpu-plain --problem 'b=1 hq=2 sq=5 skv=0 d=8 dtype=f32'");
  EXPECT_EQ(full.exit_code, 0) << full.out << full.err;
  EXPECT_NE(full.out.find("verdict: VACUOUS"), std::string::npos) << full.out;
  EXPECT_EQ(full.out.find("PASS"), std::string::npos) << full.out;
  const Outcome quiet = flashcheck("run -q --subject cpu-plain --problem 'b=1 hq=2 sq=5 skv=0 d=8 dtype=f32' "
                                   "--problem 'b=1 hq=2 sq=5 skv=5 d=8 dtype=f32'");
  EXPECT_EQ(quiet.exit_code, 0) << quiet.out << quiet.err;
  EXPECT_NE(quiet.out.find("VACUOUS   cpu-plain"), std::string::npos) << quiet.out;
  EXPECT_NE(quiet.out.find("1 pass, 0 fail, 1 vacuous"), std::string::npos) << quiet.out;
}

TEST(CliTest, RunRefusesValuesBeyondTheComputeDtypeWithAReason) {
  // wmma-tiles computes f32 inputs in f16: |V| up to 0.9 x f32's max is outside its domain.
  const Outcome r = flashcheck("run --subject wmma-tiles --problem "
                               "'b=1 hq=4 sq=100 skv=100 d=64 dtype=f32 values=near_overflow(3000,0.9)'");
  if (r.err.find("unknown subject") != std::string::npos) GTEST_SKIP() << "no CUDA build: " << r.err;
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("beyond the range of f16"), std::string::npos) << r.err;
}

TEST(CliTest, RecordsAreAppendedAsJsonLines) {
  const auto path = scratch_dir() / "records" / "out.jsonl";
  std::filesystem::remove(path);
  for (int i = 0; i < 2; ++i) {
    const Outcome r = flashcheck(std::string("run --subject cpu-lowp --record ") + path.string() + " --problem '" +
                                 kGqaCausalLine + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::ifstream file(path);
  std::string line;
  int records = 0;
  while (std::getline(file, line)) {
    const auto record = nlohmann::json::parse(line);
    EXPECT_EQ(record["subject"], "cpu-lowp");
    EXPECT_EQ(record["verdict"], "pass");
    EXPECT_EQ(record["schema"], 2);
    EXPECT_TRUE(record["metrics"]["o"]["errors"].contains("p999"));
    EXPECT_TRUE(record["tolerance"]["checks"].is_array());
    EXPECT_NE(record["problem"].get<std::string>().find("mask=causal_br"), std::string::npos);
    ++records;
  }
  EXPECT_EQ(records, 2);
}

struct BadRun {
  const char* name;
  const char* args;
  const char* fragment;
};

void PrintTo(const BadRun& run, std::ostream* os) { *os << run.args; }

class CliBadInputTest : public testing::TestWithParam<BadRun> {};

TEST_P(CliBadInputTest, OneLineAndExitCodeTwo) {
  const Outcome r = flashcheck(GetParam().args);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(GetParam().fragment), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, CliBadInputTest,
    testing::Values(
        BadRun{"Malformed", "run -s cpu-lowp -p 'b=1 hq=8 sq12 skv=12 d=64 dtype=bf16'", "sq12: expected key=value"},
        BadRun{"Truncated", "run -s cpu-lowp -p 'b=1 hq=8 hkv=2 sq=12'", "skv: missing"},
        BadRun{"UnknownDtype", "run -s cpu-lowp -p 'b=1 hq=8 sq=12 skv=12 d=64 dtype=fp8'", "unknown dtype 'fp8'"},
        BadRun{"UnknownMask", "run -s cpu-lowp -p 'b=1 hq=8 sq=12 skv=12 d=64 dtype=f16 mask=causal'", "unknown mask"},
        BadRun{"NegativeSize", "run -s cpu-lowp -p 'b=1 hq=8 sq=-12 skv=12 d=64 dtype=f16'", "sq: -12 must be >= 0"},
        BadRun{"GqaNotMultiple", "run -s cpu-lowp -p 'b=1 hq=6 hkv=4 sq=12 skv=12 d=64 dtype=f16'", "not a multiple"},
        BadRun{"WindowOnCausal", "run -s cpu-lowp -p 'b=1 hq=4 sq=12 skv=12 d=64 dtype=f16 mask=causal_tl window=3,0'",
               "only valid with mask=window"},
        BadRun{"TooBig", "run -s cpu-lowp -p 'b=4096 hq=64 sq=131072 skv=131072 d=256 dtype=f32'", "GiB"},
        BadRun{"Unsupported", "run -s cpu-lowp -p 'b=1 hq=1 sq=4 skv=4 d=1000 dtype=f16'", "unsupported"},
        BadRun{"UnknownSubject", "run -s no-such-kernel -p 'b=1 hq=1 sq=4 skv=4 d=16 dtype=f16'", "unknown subject"},
        BadRun{"NoProblem", "run -s cpu-lowp", "no problem given"},
        BadRun{"MissingSubject", "run -p 'b=1 hq=1 sq=4 skv=4 d=16 dtype=f16'", "--subject is required"},
        BadRun{"UnknownCommand", "frobnicate", "unknown command 'frobnicate'"},
        BadRun{"MissingProblemsFile", "run -s cpu-lowp --problems /nonexistent/problems.txt", "cannot read"}),
    [](const testing::TestParamInfo<BadRun>& info) { return info.param.name; });

TEST(CliTest, BadLineInAProblemsFileNamesTheLine) {
  const auto path = scratch_dir() / "problems.txt";
  std::ofstream(path) << "# a comment\n" << kGqaCausalLine << "\n\nb=1 hq=2 sq=3 skv=3 d=8 dtype=f17\n";
  const Outcome r = flashcheck("run -s cpu-lowp --problems " + path.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("problems.txt:4"), std::string::npos) << r.err;
}

TEST(CliTest, SweepOverAProblemsFileSummarisesAndPasses) {
  const auto path = scratch_dir() / "problems.txt";
  std::ofstream(path) << kGqaCausalLine << "\n"
                      << "b=1 hq=2 sq=17 skv=0 d=8 dtype=f16\n"
                      << "b=1 hq=2 sq=5 skv=9 d=1000 dtype=f16\n";  // unsupported: skipped under 'all'
  const Outcome r = flashcheck("run -s all -q --problems " + path.string());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // Every subject that can run here takes the first two problems (f16: the
  // f32-only kernels refuse them) ... so count from `list`: CPU subjects always
  // run; GPU subjects only with a GPU, and the fp32 GPU kernels refuse f16.
  const Outcome listed = flashcheck("list");
  const int subjects = std::stoi(listed.out.substr(0, listed.out.find(' ')));
  ASSERT_GT(subjects, 0);
  int runnable = 0;
  const bool gpu_present = listed.out.find("GPU: none") == std::string::npos;
  for (std::size_t at = listed.out.find("dtypes="); at != std::string::npos; at = listed.out.find("dtypes=", at + 1)) {
    const std::string line = listed.out.substr(at, listed.out.find('\n', at) - at);
    const bool takes_f16_and_bf16 = line.find("f16") != std::string::npos && line.find("bf16") != std::string::npos;
    if (takes_f16_and_bf16 && (line.find("device=cpu") != std::string::npos || gpu_present)) ++runnable;
  }
  // The second problem has no key (skv=0): vacuous, counted apart from the passes.
  const std::string expected = std::to_string(3 * subjects) + " case(s): " + std::to_string(runnable) +
                               " pass, 0 fail, " + std::to_string(runnable) +
                               " vacuous (nothing compared), 0 deviation (a declared limit), " +
                               std::to_string(3 * subjects - 2 * runnable) + " unsupported";
  EXPECT_NE(r.out.find(expected), std::string::npos) << "expected '" << expected << "' in\n" << r.out;
}

}  // namespace
}  // namespace flashcheck
