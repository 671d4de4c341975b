// The flashcheck binary: verdicts, exit codes (0 pass, 1 fail, 2 bad input or
// unsupported, 3 internal error), one clear line per bad input, and records.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "flashcheck/core/record.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"
#include "properties/cli_runner.hpp"

namespace flashcheck {
namespace {

using testing_cli::count_lines;
using testing_cli::Outcome;
using testing_cli::slurp;

// This process's scratch folders, one per test, removed when the tests end.
std::filesystem::path scratch_root() {
  return std::filesystem::temp_directory_path() / ("flashcheck_cli_test_" + std::to_string(::getpid()));
}

std::filesystem::path scratch_dir() {
  const auto dir = scratch_root() / testing::UnitTest::GetInstance()->current_test_info()->name();
  std::filesystem::create_directories(dir);
  return dir;
}

class RemoveScratch : public testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(scratch_root(), ignored);
  }
};
[[maybe_unused]] testing::Environment* const remove_scratch = testing::AddGlobalTestEnvironment(new RemoveScratch);

// Runs flashcheck with the given (shell-quoted) arguments in this test's scratch folder.
Outcome flashcheck(const std::string& args) { return testing_cli::run_binary(FLASHCHECK_BINARY, args, scratch_dir()); }

const char* kGqaCausalLine = "b=2 hq=8 hkv=2 sq=128 skv=192 d=64 dtype=bf16 mask=causal_br values=normal(0.5,1) dseed=4";

TEST(CliTest, ListShowsTheCpuSubjectAndTheSmokeTestApart) {
  const Outcome r = flashcheck("list");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto smoke_section = r.out.find("smoke test(s), not in 'all'");
  ASSERT_NE(smoke_section, std::string::npos) << r.out;
  // cpu-plain, the CPU control, among the subjects; smoke-cpu-lowp after them, marked.
  const auto plain = r.out.find("  cpu-plain ");
  EXPECT_LT(plain, smoke_section) << r.out;
  EXPECT_NE(r.out.find("smoke-cpu-lowp       [smoke]", smoke_section), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("smoke-cpu-lowp"), r.out.find("smoke-cpu-lowp", smoke_section)) << "listed among the subjects\n"
                                                                                       << r.out;
  EXPECT_NE(r.out.find("masks=none,causal_tl,causal_br,window"), std::string::npos) << r.out;
}

TEST(CliTest, AllLeavesTheSmokeTestOut) {
  const Outcome r = flashcheck(std::string("run -s all --problem '") + kGqaCausalLine + "'");
  EXPECT_NE(r.out.find("cpu-plain"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("smoke-cpu-lowp"), std::string::npos) << r.out;
}

TEST(CliTest, RunPrintsMetricsAndAPassVerdict) {
  const Outcome r = flashcheck(std::string("run --subject smoke-cpu-lowp --problem '") + kGqaCausalLine + "'");
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
    const Outcome r = flashcheck(std::string("run --subject smoke-cpu-lowp --record ") + path.string() + " --problem '" +
                                 kGqaCausalLine + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::ifstream file(path);
  std::string line;
  int records = 0;
  while (std::getline(file, line)) {
    const auto record = nlohmann::json::parse(line);
    EXPECT_NO_THROW((void)parse_record(line)) << "the typed reader reads what the CLI wrote: " << line;
    EXPECT_EQ(record["subject"], "smoke-cpu-lowp");
    EXPECT_EQ(record["verdict"], "pass");
    EXPECT_EQ(record["schema"], kRecordSchema);
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
        BadRun{"Malformed", "run -s smoke-cpu-lowp -p 'b=1 hq=8 sq12 skv=12 d=64 dtype=bf16'", "sq12: expected key=value"},
        BadRun{"Truncated", "run -s smoke-cpu-lowp -p 'b=1 hq=8 hkv=2 sq=12'", "skv: missing"},
        BadRun{"UnknownDtype", "run -s smoke-cpu-lowp -p 'b=1 hq=8 sq=12 skv=12 d=64 dtype=fp8'", "unknown dtype 'fp8'"},
        BadRun{"UnknownMask", "run -s smoke-cpu-lowp -p 'b=1 hq=8 sq=12 skv=12 d=64 dtype=f16 mask=causal'", "unknown mask"},
        BadRun{"NegativeSize", "run -s smoke-cpu-lowp -p 'b=1 hq=8 sq=-12 skv=12 d=64 dtype=f16'", "sq: -12 must be >= 0"},
        BadRun{"GqaNotMultiple", "run -s smoke-cpu-lowp -p 'b=1 hq=6 hkv=4 sq=12 skv=12 d=64 dtype=f16'", "not a multiple"},
        BadRun{"WindowOnCausal", "run -s smoke-cpu-lowp -p 'b=1 hq=4 sq=12 skv=12 d=64 dtype=f16 mask=causal_tl window=3,0'",
               "only valid with mask=window"},
        BadRun{"TooBig", "run -s smoke-cpu-lowp -p 'b=4096 hq=64 sq=131072 skv=131072 d=256 dtype=f32'", "GiB"},
        BadRun{"Unsupported", "run -s smoke-cpu-lowp -p 'b=1 hq=1 sq=4 skv=4 d=1000 dtype=f16'", "unsupported"},
        BadRun{"UnknownSubject", "run -s no-such-kernel -p 'b=1 hq=1 sq=4 skv=4 d=16 dtype=f16'", "unknown subject"},
        BadRun{"NoProblem", "run -s smoke-cpu-lowp", "no problem given"},
        BadRun{"MissingSubject", "run -p 'b=1 hq=1 sq=4 skv=4 d=16 dtype=f16'", "--subjects is required"},
        BadRun{"UnknownCommand", "frobnicate", "unknown command 'frobnicate'"},
        BadRun{"MissingProblemsFile", "run -s smoke-cpu-lowp --problems /nonexistent/problems.txt",
               "--problems '/nonexistent/problems.txt': no such file"},
        BadRun{"ProblemsIsAFolder", "run -s smoke-cpu-lowp --problems /", "--problems '/' is a folder"},
        BadRun{"UnknownSubjectInACommaList", "run -s cpu-plain,no-such-kernel -p 'b=1 hq=1 sq=4 skv=4 d=16 dtype=f16'",
               "unknown subject 'no-such-kernel'"},
        BadRun{"ReplayMissingFile", "replay /nonexistent/corpus/cpu-plain.problems",
               "'/nonexistent/corpus/cpu-plain.problems': no such file"},
        BadRun{"ReplayFolder", "replay /", "'/' is a folder"},
        BadRun{"ReplayLineWithoutSubject", "replay 'b=1 hq=1 sq=4 skv=4 d=16 dtype=f16'", "needs -s/--subjects"},
        // Numeric options: NaN, infinities, negatives and overflowing budgets are refused, never run.
        BadRun{"FuzzMinutesNan", "fuzz --minutes nan --out /nonexistent/sweep", "'nan' is not a finite number"},
        BadRun{"FuzzMinutesInf", "fuzz --minutes inf --out /nonexistent/sweep", "'inf' is not a finite number"},
        BadRun{"FuzzMinutesOverflow", "fuzz --minutes 1e300 --out /nonexistent/sweep", "'1e300' is outside [0, 1e+06]"},
        BadRun{"FuzzMinutesNegative", "fuzz --minutes -1 --out /nonexistent/sweep", "'-1' is outside [0, 1e+06]"},
        BadRun{"FuzzMinutesNotANumber", "fuzz --minutes ten --out /nonexistent/sweep", "'ten' is not a number"},
        BadRun{"FuzzSeedNegative", "fuzz --seed -1 --cases 1 --out /nonexistent/sweep", "'-1' is not a decimal integer"},
        BadRun{"FuzzSeedOverflow", "fuzz --seed 18446744073709551616 --cases 1 --out /nonexistent/sweep",
               "'18446744073709551616' is out of range"},
        BadRun{"FuzzSeedHex", "fuzz --seed 0x10 --cases 1 --out /nonexistent/sweep", "'0x10' is not a decimal integer"},
        BadRun{"FuzzCasesNegative", "fuzz --cases -5 --out /nonexistent/sweep", "'-5' is outside [0, "},
        BadRun{"FuzzWatchdogNan", "fuzz --cases 1 --watchdog nan --out /nonexistent/sweep", "'nan' is not a finite number"},
        BadRun{"FuzzWatchdogNegative", "fuzz --cases 1 --watchdog -3 --out /nonexistent/sweep", "'-3' is outside [0, 1e+06]"},
        BadRun{"ExternalWatchdogNan", "external --cmd x --name y --watchdog nan list", "'nan' is not a finite number"},
        BadRun{"ExternalStartupZero", "external --cmd x --name y --startup-timeout 0 list", "'0' is outside (0, 1e+06]"},
        BadRun{"BenchOracleNegativeBatch", "bench-oracle -b -1", "not in range"},
        BadRun{"FuzzOutCannotBeMade", "fuzz -s cpu-plain --cases 1 --out /dev/null/sweep",
               "--out '/dev/null/sweep': cannot make the folder"}),
    [](const testing::TestParamInfo<BadRun>& info) { return info.param.name; });

TEST(CliTest, EveryCommandTakesSubjectsAsCommaListsAndRepeats) {
  const std::string problem = std::string(" -q -p '") + kGqaCausalLine + "'";
  for (const char* subjects : {"-s cpu-plain,smoke-cpu-lowp", "-s cpu-plain -s smoke-cpu-lowp",
                               "--subjects cpu-plain --subject smoke-cpu-lowp"}) {
    const Outcome r = flashcheck(std::string("run ") + subjects + problem);
    EXPECT_EQ(r.exit_code, 0) << subjects << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("PASS      cpu-plain"), std::string::npos) << subjects << "\n" << r.out;
    EXPECT_NE(r.out.find("PASS      smoke-cpu-lowp"), std::string::npos) << subjects << "\n" << r.out;
  }
  // replay of a line with two subjects, and a comma list on list.
  const Outcome replay = flashcheck(std::string("replay '") + kGqaCausalLine + "' -s cpu-plain,smoke-cpu-lowp");
  EXPECT_EQ(replay.exit_code, 0) << replay.out << replay.err;
  EXPECT_NE(replay.out.find("2 case(s): 2 pass"), std::string::npos) << replay.out;
  const Outcome list = flashcheck("list -s cpu-plain,smoke-cpu-lowp");
  EXPECT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.out.find("1 subject(s):\n  cpu-plain "), std::string::npos) << list.out;
  EXPECT_NE(list.out.find("smoke-cpu-lowp       [smoke]"), std::string::npos) << list.out;
}

TEST(CliTest, ListJsonGivesEverySubjectWithItsCapabilities) {
  const Outcome r = flashcheck("list --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json listing = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(listing.is_discarded()) << r.out;
  ASSERT_TRUE(listing["subjects"].is_array()) << r.out;
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& subject : listing["subjects"]) by_name[subject["name"].get<std::string>()] = subject;
  ASSERT_TRUE(by_name.count("cpu-plain")) << r.out;
  const nlohmann::json& plain = by_name["cpu-plain"];
  EXPECT_EQ(plain["kind"], "subject");
  EXPECT_EQ(plain["in_all"], true);
  EXPECT_EQ(plain["available"], true);
  EXPECT_FALSE(plain["description"].get<std::string>().empty());
  const auto& masks = plain["capabilities"]["masks"];
  EXPECT_NE(std::find(masks.begin(), masks.end(), "causal_br"), masks.end()) << plain.dump();
  EXPECT_TRUE(plain["capabilities"].contains("dtypes")) << plain.dump();
  EXPECT_EQ(plain["capabilities"]["needs_gpu"], false);
  ASSERT_TRUE(by_name.count("smoke-cpu-lowp")) << r.out;
  EXPECT_EQ(by_name["smoke-cpu-lowp"]["kind"], "smoke");
  EXPECT_EQ(by_name["smoke-cpu-lowp"]["in_all"], false);
  // Every subject that the text form lists is in the JSON form.
  const Outcome text = flashcheck("list");
  const auto count = text.out.substr(0, text.out.find(' '));
  int subjects = 0;
  for (const auto& subject : listing["subjects"]) subjects += subject["kind"] == "subject";
  EXPECT_EQ(std::to_string(subjects), count) << text.out;
  // -s narrows it.
  const Outcome one = flashcheck("list --json -s cpu-plain");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const nlohmann::json only = nlohmann::json::parse(one.out);
  ASSERT_EQ(only["subjects"].size(), 1u) << one.out;
  EXPECT_EQ(only["subjects"][0]["name"], "cpu-plain");
}

TEST(CliTest, AnUnknownSubjectIsQuotedToEightyCharacters) {
  const std::string name(5000, 'k');
  const Outcome r = flashcheck("run -s " + name + " -p 'b=1 hq=1 sq=4 skv=4 d=16 dtype=f16'");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("unknown subject '" + name.substr(0, 80) + "...'"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 200u) << r.err;
}

TEST(CliTest, AnInternalErrorIsExitThreeWithOneLine) {
  // Appending records to /dev/full opens, then every write fails: not the
  // user's input, so not exit 2.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const Outcome r = flashcheck(std::string("run -s cpu-plain --record /dev/full -p '") + kGqaCausalLine + "'");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_EQ(r.err.rfind("flashcheck: internal error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find("/dev/full"), std::string::npos) << r.err;
}

TEST(CliTest, ARecordFileThatCannotBeOpenedIsBadInput) {
  const Outcome r = flashcheck(std::string("run -s cpu-plain --record / -p '") + kGqaCausalLine + "'");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--record: cannot open record file '/'"), std::string::npos) << r.err;
}

TEST(CliTest, ASweepThatRanNoCaseSaysSoAndFails) {
  // A budget of 60 ns ends before the first case is drawn.
  const auto out = scratch_dir() / "sweep";
  const Outcome r = flashcheck("fuzz -s cpu-plain --minutes 1e-9 --out " + out.string());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("fuzz: no case ran: the budget ended before the first case"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("0 case(s) run"), std::string::npos) << r.out;
}

TEST(CliTest, ProgressGoesToStderrOnlyWhenItIsATerminal) {
  const std::string args = std::string(" run -q -s cpu-plain,smoke-cpu-lowp -p '") + kGqaCausalLine + "'";
  // A pipe: no progress line.
  const Outcome piped = flashcheck(args);
  EXPECT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.err.find("case 1/2"), std::string::npos) << piped.err;
  // A terminal (script(1) gives the command one): "case i/n" rewritten in place.
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "no script(1) to make a terminal";
  const auto transcript = scratch_dir() / "tty";
  const std::string command = "timeout 120 script -qec \"" FLASHCHECK_BINARY + args + " >/dev/null\" /dev/null >" +
                              transcript.string() + " 2>&1 </dev/null";
  const int status = std::system(command.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << slurp(transcript);
  const std::string tty = slurp(transcript);
  EXPECT_NE(tty.find("\rcase 1/2: cpu-plain b=2 hq=8"), std::string::npos) << tty;
  EXPECT_NE(tty.find("\rcase 2/2: smoke-cpu-lowp"), std::string::npos) << tty;
  EXPECT_NE(tty.find("\r\x1b[K"), std::string::npos) << "the line is erased when done\n" << tty;
}

TEST(CliTest, BadLineInAProblemsFileNamesTheLine) {
  const auto path = scratch_dir() / "problems.txt";
  std::ofstream(path) << "# a comment\n" << kGqaCausalLine << "\n\nb=1 hq=2 sq=3 skv=3 d=8 dtype=f17\n";
  const Outcome r = flashcheck("run -s smoke-cpu-lowp --problems " + path.string());
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
  // CPU subjects taking f16 and bf16 run the first two problems; GPU subjects
  // do where a GPU is present and their domain admits them (decode's sq <= 16,
  // kernels that refuse empty sequences): between none and both.
  int cpu_runnable = 0, gpu_candidates = 0;
  const bool gpu_present = listed.out.find("GPU: none") == std::string::npos;
  const std::size_t smoke_tests = listed.out.find("smoke test(s), not in 'all'");  // listed after the subjects
  for (std::size_t at = listed.out.find("dtypes="); at < smoke_tests; at = listed.out.find("dtypes=", at + 1)) {
    const std::string line = listed.out.substr(at, listed.out.find('\n', at) - at);
    if (line.find("f16") == std::string::npos || line.find("bf16") == std::string::npos) continue;
    if (line.find("device=cpu") != std::string::npos) ++cpu_runnable;
    else if (gpu_present) ++gpu_candidates;
  }
  ASSERT_GT(cpu_runnable, 0);
  // The second problem has no key (skv=0): vacuous, counted apart from the
  // passes. The rest is unsupported (outside a domain) or, for GPU subjects
  // without a GPU, unavailable: skipped either way, never passed.
  const auto at = r.out.find("summary: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  int total = -1, pass = -1, fail = -1, vacuous = -1, deviation = -1, unsupported = -1, unavailable = -1;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at,
                        "summary: %d case(s): %d pass, %d fail, %d vacuous (nothing compared), %d deviation (a declared "
                        "limit), %d unsupported (skipped), %d unavailable",
                        &total, &pass, &fail, &vacuous, &deviation, &unsupported, &unavailable),
            7)
      << r.out;
  EXPECT_EQ(total, 3 * subjects) << r.out;
  EXPECT_EQ(fail, 0) << r.out;
  EXPECT_EQ(deviation, 0) << r.out;
  EXPECT_EQ(pass + vacuous + unsupported + unavailable, total) << r.out;
  EXPECT_GE(pass, cpu_runnable) << r.out;
  EXPECT_LE(pass, cpu_runnable + gpu_candidates) << r.out;
  EXPECT_GE(vacuous, cpu_runnable) << r.out;
  EXPECT_LE(vacuous, cpu_runnable + gpu_candidates) << r.out;
  if (!gpu_present) {  // exact where only the CPU subjects run
    EXPECT_EQ(pass, cpu_runnable) << r.out;
    EXPECT_EQ(vacuous, cpu_runnable) << r.out;
  }
  const bool gpu_subjects = listed.out.find("device=gpu") != std::string::npos;
  EXPECT_EQ(unavailable > 0, gpu_subjects && !gpu_present) << r.out;
  if (unavailable > 0) {
    EXPECT_NE(r.out.find("UNAVAILABLE"), std::string::npos) << r.out;
  }
}

// --require-gpu (run, fuzz, bench): a subject that cannot run here is a
// failure with one line naming it and why; without the flag it is reported
// UNAVAILABLE and is never a pass. These run where no GPU is usable.
class RequireGpuTest : public testing::Test {
 protected:
  void SetUp() override {
    const Outcome listed = flashcheck("list");
    ASSERT_EQ(listed.exit_code, 0) << listed.err;
    if (listed.out.find("GPU: none") == std::string::npos) GTEST_SKIP() << "a GPU is usable here";
    // A GPU subject of the build (none without CUDA) whose domain holds kProblem.
    for (std::size_t at = listed.out.find("device=gpu"); at != std::string::npos && gpu_subject_.empty();
         at = listed.out.find("device=gpu", at + 1)) {
      const std::size_t line_start = listed.out.rfind('\n', at);
      const std::string caps = listed.out.substr(line_start, listed.out.find('\n', at) - line_start);
      if (caps.find("dtypes=f16,bf16 d=64,") == std::string::npos || caps.find("sq<=") != std::string::npos ||
          caps.find("seqlen_multiple") != std::string::npos)
        continue;
      const std::size_t name_line = listed.out.rfind('\n', line_start - 1);
      std::istringstream(listed.out.substr(name_line + 1)) >> gpu_subject_;
    }
  }
  static constexpr const char* kProblem = " -p 'b=1 hq=2 sq=64 skv=64 d=64 dtype=f16'";
  std::string gpu_subject_;
};

TEST_F(RequireGpuTest, AGpuSubjectFailsWithOneLine) {
  if (gpu_subject_.empty()) GTEST_SKIP() << "built without CUDA: no GPU subject (see ...WithNoGpuAtAll)";
  for (const std::string command : {"run", "bench"}) {
    const Outcome r = flashcheck(command +  " --require-gpu -s " + gpu_subject_ + kProblem);
    EXPECT_EQ(r.exit_code, 1) << command << "\n" << r.out << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << command << "\n" << r.err;
    EXPECT_NE(r.err.find(gpu_subject_ + " is unavailable here: needs a GPU"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("PASS"), std::string::npos) << r.out;
  }
  const Outcome fuzz = flashcheck("fuzz --require-gpu --subjects " + gpu_subject_ + " --cases 2 --out " +
                                  (scratch_dir() / "sweep").string());
  EXPECT_EQ(fuzz.exit_code, 1) << fuzz.out << fuzz.err;
  EXPECT_EQ(count_lines(fuzz.err), 1) << fuzz.err;
  EXPECT_NE(fuzz.err.find(gpu_subject_ + " is unavailable here"), std::string::npos) << fuzz.err;
}

TEST_F(RequireGpuTest, WithoutTheFlagAGpuSubjectIsUnavailableNeverPassed) {
  if (gpu_subject_.empty()) GTEST_SKIP() << "built without CUDA: no GPU subject";
  const Outcome r = flashcheck("run -s " + gpu_subject_ + kProblem);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;  // nothing ran: not a pass
  EXPECT_NE(r.out.find("UNAVAILABLE  " + gpu_subject_), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("PASS"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("no case ran: every subject/problem pair was unavailable"), std::string::npos) << r.err;
  // Beside a CPU subject that passes: exit 0, and the GPU subject said UNAVAILABLE.
  const Outcome mixed =
      flashcheck("run -s cpu-plain -s " + gpu_subject_ + kProblem);
  EXPECT_EQ(mixed.exit_code, 0) << mixed.out << mixed.err;
  EXPECT_NE(mixed.out.find("1 pass, 0 fail, 0 vacuous (nothing compared), 0 deviation (a declared limit), 0 unsupported (skipped), 1 unavailable"), std::string::npos) << mixed.out;
  EXPECT_NE(mixed.out.find("UNAVAILABLE  " + gpu_subject_), std::string::npos) << mixed.out;
}

TEST_F(RequireGpuTest, ACpuSubjectAloneFailsWithNoGpuAtAll) {
  const Outcome r = flashcheck(std::string("run --require-gpu -s cpu-plain -p '") + kGqaCausalLine + "'");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--require-gpu: no GPU is usable here"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("PASS"), std::string::npos) << r.out;
}

TEST(CliTest, RunFuzzAndBenchShareRequireGpuAndDocumentTheirExitCodes) {
  for (const char* command : {"run", "fuzz", "bench"}) {
    const Outcome r = flashcheck(std::string(command) + " --help");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    // --every-row on the commands that judge (bench times, it does not judge).
    // (CLI11 2.1 writes the default as "=auto"; the GPU machine's CLI11 as " [auto]".)
    const bool every_row_auto = r.out.find("--every-row TEXT:{off,auto,on}=auto") != std::string::npos ||
                                r.out.find("--every-row TEXT:{off,auto,on} [auto]") != std::string::npos;
    EXPECT_EQ(every_row_auto, std::string(command) != "bench") << command << "\n" << r.out;
    EXPECT_NE(r.out.find("--require-gpu"), std::string::npos) << command << "\n" << r.out;
    EXPECT_NE(r.out.find("Fail (exit 1) when a chosen subject is unavailable here"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Exit codes: 0"), std::string::npos) << command << "\n" << r.out;
  }
}

// --every-row (run and fuzz, the commands that judge), where the GPU reference
// cannot run (no CUDA Kokkos, or no GPU): `on` is exit 1 with one line; `auto`
// (the default) keeps the sampled verdict and says why, on the terminal and in
// the record; a word outside off|auto|on is bad input.
TEST(CliTest, EveryRowWithoutTheGpuReference) {
  if (kokkos_device_available()) GTEST_SKIP() << "the every-row reference runs on a GPU here";
  const std::string sampled =
      " -s cpu-plain -p 'b=1 hq=2 hkv=1 sq=300 skv=320 d=32 dtype=bf16 mask=causal_br' --rows 16";
  const Outcome on = flashcheck("run --every-row on" + sampled);
  EXPECT_EQ(on.exit_code, 1) << on.out << on.err;
  EXPECT_EQ(count_lines(on.err), 1) << on.err;
  EXPECT_NE(on.err.find("--every-row on: the Kokkos reference cannot run on a GPU here"), std::string::npos) << on.err;
  EXPECT_EQ(on.out.find("PASS"), std::string::npos) << on.out;
  const Outcome fuzz =
      flashcheck("fuzz --every-row on --subjects cpu-plain --cases 2 --out " + (scratch_dir() / "sweep").string());
  EXPECT_EQ(fuzz.exit_code, 1) << fuzz.out << fuzz.err;
  EXPECT_EQ(count_lines(fuzz.err), 1) << fuzz.err;

  const auto records = scratch_dir() / "records.jsonl";
  const Outcome automatic = flashcheck("run --every-row auto" + sampled + " --record " + records.string());
  EXPECT_EQ(automatic.exit_code, 0) << automatic.out << automatic.err;
  EXPECT_NE(automatic.out.find("every row: not checked (the Kokkos reference cannot run on a GPU here"),
            std::string::npos)
      << automatic.out;
  const auto record = nlohmann::json::parse(slurp(records));
  EXPECT_EQ(record["rows_basis"], "sampled");
  EXPECT_EQ(record["rows_checked"], 19);
  EXPECT_NE(record.value("every_row_unavailable", "").find("cannot run on a GPU here"), std::string::npos)
      << record.dump();

  // The default is auto: the same note. off: the sample, and no note.
  const auto default_records = scratch_dir() / "default.jsonl";
  const Outcome by_default = flashcheck("run" + sampled + " --record " + default_records.string());
  EXPECT_EQ(by_default.exit_code, 0) << by_default.out << by_default.err;
  EXPECT_NE(by_default.out.find("every row: not checked"), std::string::npos) << by_default.out;
  const auto default_record = nlohmann::json::parse(slurp(default_records));
  EXPECT_EQ(default_record["rows_basis"], "sampled");
  EXPECT_TRUE(default_record.contains("every_row_unavailable")) << default_record.dump();
  const auto off_records = scratch_dir() / "off.jsonl";
  const Outcome off = flashcheck("run --every-row off" + sampled + " --record " + off_records.string());
  EXPECT_EQ(off.exit_code, 0) << off.out << off.err;
  EXPECT_EQ(off.out.find("every row: not checked"), std::string::npos) << off.out;
  const auto off_record = nlohmann::json::parse(slurp(off_records));
  EXPECT_EQ(off_record["rows_basis"], "sampled");
  EXPECT_FALSE(off_record.contains("every_row_unavailable")) << off_record.dump();

  const Outcome bad = flashcheck("run --every-row maybe" + sampled);
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_EQ(count_lines(bad.err), 1) << bad.err;
}

}  // namespace
}  // namespace flashcheck
