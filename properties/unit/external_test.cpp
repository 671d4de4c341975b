// External subjects (external/): the .npy files, the capabilities' JSON form,
// and the worker protocol against properties/external/fake_worker.py, a
// standard-library Python worker that answers correctly or misbehaves on
// purpose (a crash, a hang, garbage, wrong shapes and dtypes, bad handshakes).
// No GPU is needed.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flashcheck/core/values.hpp"
#include "flashcheck/external/npy.hpp"
#include "flashcheck/external/subject.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck::external {
namespace {

namespace fs = std::filesystem;

std::string fake(const std::string& mode, int at = 1) {
  return fmt::format("{} {} --mode {} --at {}", FLASHCHECK_PYTHON, FLASHCHECK_FAKE_WORKER, mode, at);
}

WorkerSpec spec(const std::string& mode, int at = 1, double watchdog = 0) {
  WorkerSpec s;
  s.name = "fake-" + mode;
  s.command = fake(mode, at);
  s.startup_seconds = 20;
  s.watchdog_seconds = watchdog;
  return s;
}

const Problem kSmall = parse_problem("b=1 hq=4 hkv=2 sq=9 skv=13 d=8 dtype=bf16 layout=bshd mask=causal_br dseed=3");

TEST(Npy, RoundTripKeepsDescrShapeAndBytes) {
  const fs::path path = fs::temp_directory_path() / "flashcheck-npy-test.npy";
  const std::vector<std::uint16_t> data{1, 2, 3, 4, 5, 6};
  write_npy(path, "<u2", {2, 3}, data.data(), data.size() * 2);
  const NpyArray array = read_npy(path);
  EXPECT_EQ(array.descr, "<u2");
  EXPECT_EQ(array.shape, (std::vector<std::int64_t>{2, 3}));
  ASSERT_EQ(array.bytes.size(), 12u);
  EXPECT_EQ(std::memcmp(array.bytes.data(), data.data(), 12), 0);
  const float one = 1.5f;
  write_npy(path, "<f4", {1}, &one, 4);  // (1,) keeps its comma
  EXPECT_EQ(read_npy(path).shape, (std::vector<std::int64_t>{1}));
  fs::remove(path);
}

TEST(Npy, RefusesWhatIsNotAnArrayItCanRead) {
  const fs::path path = fs::temp_directory_path() / "flashcheck-npy-bad.npy";
  std::ofstream(path) << "hello";
  EXPECT_THROW(read_npy(path), std::runtime_error);
  const float data[4] = {};
  write_npy(path, "<f4", {2, 3}, data, sizeof data);  // 4 floats for a 2x3 shape
  try {
    read_npy(path);
    FAIL() << "a short file was read";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("expected 24"), std::string::npos) << error.what();
  }
  EXPECT_THROW(read_npy(fs::temp_directory_path() / "flashcheck-no-such.npy"), std::runtime_error);
  // A forged shape is refused before anything is allocated for it.
  write_npy(path, "<f4", {std::int64_t{1} << 40}, data, sizeof data);
  EXPECT_THROW(read_npy(path), std::runtime_error);
  write_npy(path, "<f4", {std::int64_t{1} << 40, std::int64_t{1} << 40, std::int64_t{1} << 40}, data, sizeof data);
  EXPECT_THROW(read_npy(path), std::runtime_error);  // the size overflows 64 bits
  fs::remove(path);
}

TEST(Npy, RefusesWhatIsNotARegularFileWithoutBlocking) {
  const fs::path fifo = fs::temp_directory_path() / fmt::format("flashcheck-npy-fifo-{}", ::getpid());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  try {
    read_npy(fifo);  // nobody writes it: a blocking open would never return
    ADD_FAILURE() << "a FIFO was read";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("is a FIFO, not a regular file"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5);
  fs::remove(fifo);
  EXPECT_THROW(read_npy(fs::temp_directory_path()), std::runtime_error);  // a folder
}

TEST(Npy, RefusesByItsSizeWhatTheCallerCannotUse) {
  const fs::path path = fs::temp_directory_path() / fmt::format("flashcheck-npy-limit-{}.npy", ::getpid());
  const std::vector<float> data(1000, 1.0f);
  write_npy(path, "<f4", {1000}, data.data(), 4000);
  EXPECT_EQ(read_npy(path, {4000}).bytes.size(), 4000u);
  try {
    read_npy(path, {400});  // the file alone is too large
    ADD_FAILURE() << "a file larger than the limit was read";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("refused unread"), std::string::npos) << error.what();
  }
  try {
    read_npy(path, {3999});  // within the header's slack, but the shape is too large
    ADD_FAILURE() << "a shape larger than the limit was read";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("4000 data bytes, more than the problem's output can be"),
              std::string::npos)
        << error.what();
  }
  fs::remove(path);
}

TEST(CapabilitiesJson, RoundTripsAndNamesBadKeys) {
  Capabilities c;
  c.dtypes = {DType::f16, DType::bf16};
  c.masks = {MaskKind::none, MaskKind::window};
  c.head_dims = {64, 128};
  c.gqa = c.lse = c.needs_gpu = c.softcap = c.alibi = true;
  c.min_page_size = 16;
  c.page_size_multiple = 16;
  c.page_size_power_of_two = true;
  c.max_seqlen_kv = 4096;
  c.compute_dtype = DType::f16;
  std::string deviations;
  const Capabilities back = capabilities_from_json(to_json(c), deviations);
  EXPECT_EQ(describe(back), describe(c));
  for (const char* bad : {R"({"dtypes": ["f16"]})",                                // masks missing
                          R"({"dtypes": ["f8"], "masks": ["none"]})",              // unknown dtype
                          R"({"dtypes": ["f16"], "masks": ["none"], "gqa": 1})",   // wrong type
                          R"({"dtypes": ["f16"], "masks": ["none"], "lse_out": true})",  // a typo
                          R"({"dtypes": [], "masks": ["none"]})"}) {
    EXPECT_THROW(capabilities_from_json(nlohmann::json::parse(bad), deviations), std::runtime_error) << bad;
  }
}

TEST(ExternalWorker, GoodWorkerPassesTheOracle) {
  ExternalSubject subject(spec("good"));
  EXPECT_EQ(subject.name(), "fake-good");
  EXPECT_EQ(subject.version_info(), "fake 1.0");
  EXPECT_TRUE(subject.capabilities().lse);
  for (const char* line : {"b=1 hq=4 hkv=2 sq=9 skv=13 d=8 dtype=bf16 layout=bshd mask=causal_br dseed=3",
                           "b=2 hq=2 sq=17 skv=5 d=16 dtype=f16 mask=causal_br dseed=4",  // rows with no key
                           "b=1 hq=1 sq=12 skv=12 d=16 dtype=f32 mask=window window=2,1 dseed=5",
                           "b=1 hq=3 sq=7 skv=24 d=8 dtype=bf16 mask=causal_tl values=outliers(0.01,100)"}) {
    const CaseResult result = judge(subject, parse_problem(line));
    EXPECT_TRUE(result.passed()) << line << "\n" << explain(result);
    EXPECT_TRUE(result.subject_metrics.has_lse) << line;
  }
}

TEST(ExternalWorker, WrongNumbersFailTheOracle) {
  ExternalSubject subject(spec("wrong-scale"));
  const CaseResult result = judge(subject, parse_problem("b=1 hq=2 sq=16 skv=16 d=16 dtype=f32 dseed=9"));
  EXPECT_EQ(result.status, Status::ok);
  EXPECT_FALSE(result.passed()) << explain(result);
}

// The serving vocabulary through the protocol: softcap and ALiBi in the
// shape, a paged K/V cache as pools and a page table (int32 .npy), which the
// fake reads through; a fake that ignores the table fails the oracle.
TEST(ExternalWorker, ScoreModificationsAndPagedKeysTravelToTheWorker) {
  ExternalSubject good(spec("good")), ignoring(spec("page-table-ignored"));
  EXPECT_TRUE(good.capabilities().softcap && good.capabilities().alibi);
  EXPECT_EQ(good.capabilities().min_page_size, 1);
  for (const char* line : {"b=1 hq=4 hkv=2 sq=9 skv=13 d=8 dtype=bf16 mask=causal_br softcap=5 alibi=yes dseed=3",
                           "b=1 hq=2 hkv=1 sq=6 skv=11 d=8 dtype=f32 softcap=1 alibi=yes pass=bwd dseed=4",
                           "b=3 hq=4 hkv=2 sq=12 skv=20 d=8 dtype=f32 mask=causal_br page=3 dseed=5",
                           "b=2 hq=2 hkv=1 sq=5 skv=23 d=16 dtype=bf16 layout=bshd softcap=5 page=16 gseed=4"}) {
    const CaseResult result = judge(good, parse_problem(line));
    EXPECT_TRUE(result.passed()) << line << "\n" << explain(result);
  }
  const CaseResult wrong = judge(ignoring, parse_problem("b=3 hq=4 hkv=2 sq=12 skv=20 d=8 dtype=f32 page=3 dseed=5"));
  EXPECT_EQ(wrong.status, Status::ok);
  EXPECT_FALSE(wrong.passed()) << explain(wrong);
  EXPECT_TRUE(judge(ignoring, parse_problem("b=3 hq=4 hkv=2 sq=12 skv=20 d=8 dtype=f32 dseed=5")).passed());
}

TEST(ExternalWorker, OutsideTheDomainIsRefusedWithoutAsking) {
  ExternalSubject subject(spec("good"));
  const RunResult result = subject.run(parse_problem("b=1 hq=1 sq=4 skv=4 d=64 dtype=f32"), {});
  EXPECT_EQ(result.status, Status::unsupported);
  EXPECT_NE(result.message.find("head_dim 64"), std::string::npos) << result.message;
}

TEST(ExternalWorker, UnsupportedAndErrorAnswersAreKept) {
  ExternalSubject unsupported(spec("unsupported"));
  RunResult result = unsupported.run(kSmall, generate_inputs(kSmall));
  EXPECT_EQ(result.status, Status::unsupported);
  EXPECT_NE(result.message.find("the fake supports nothing"), std::string::npos) << result.message;
  ExternalSubject error(spec("error"));
  result = error.run(kSmall, generate_inputs(kSmall));
  EXPECT_EQ(result.status, Status::error);
  EXPECT_NE(result.message.find("the fake failed, as asked"), std::string::npos) << result.message;
}

/// A misbehaving worker makes its case an error whose message contains
/// `expected`; the case before it and the one after it (a restarted worker,
/// or the same one) pass.
void expect_failure_then_recovery(const std::string& mode, const std::string& expected, double watchdog = 0) {
  SCOPED_TRACE(mode);
  ExternalSubject subject(spec(mode, 2, watchdog));
  const Inputs inputs = generate_inputs(kSmall);
  EXPECT_EQ(subject.run(kSmall, inputs).status, Status::ok);
  const auto start = std::chrono::steady_clock::now();
  const RunResult failed = subject.run(kSmall, inputs);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(failed.status, Status::error);
  EXPECT_NE(failed.message.find(expected), std::string::npos) << failed.message;
  if (watchdog > 0) EXPECT_LT(seconds, watchdog + 5);
  const CaseResult after = judge(subject, kSmall);
  EXPECT_TRUE(after.passed()) << explain(after);
}

TEST(ExternalWorker, CrashIsAFailedCaseAndTheWorkerRestarts) {
  expect_failure_then_recovery("crash", "killed by signal 11");
}

TEST(ExternalWorker, HangIsKilledByTheWatchdog) { expect_failure_then_recovery("hang", "within 2 s (watchdog)", 2); }

TEST(ExternalWorker, GarbageIsAFailedCase) { expect_failure_then_recovery("garbage", "malformed reply"); }

TEST(ExternalWorker, WrongShapeIsAFailedCase) {
  expect_failure_then_recovery("wrong-shape", "returned O as '<u2' [1, 8, 4, 8], but the problem needs '<u2' [1, 9, 4, 8]");
}

TEST(ExternalWorker, WrongDtypeIsAFailedCase) {
  expect_failure_then_recovery("wrong-dtype", "returned O as '<f4'");
}

TEST(ExternalWorker, AFatalErrorRetiresTheWorker) {
  expect_failure_then_recovery("fatal", "reported an error and retired: CUDA error (fake)");
}

TEST(ExternalWorker, UntrustedTypesInAReplyDoNotThrow) {
  ExternalSubject subject(spec("null-reason"));
  const RunResult result = subject.run(kSmall, generate_inputs(kSmall));
  EXPECT_EQ(result.status, Status::unsupported);
  EXPECT_NE(result.message.find("no reason given"), std::string::npos) << result.message;
  expect_failure_then_recovery("bad-status", "with status 5");
}

TEST(ExternalWorker, WrongIdIsAFailedCase) { expect_failure_then_recovery("wrong-id", "answered case"); }

TEST(ExternalWorker, MissingLseIsAFailedCase) { expect_failure_then_recovery("no-lse", "did not write it"); }

// Issue 21's worker findings, each a regression test.

TEST(ExternalWorker, AFifoForOutputIsRefusedWithinTheWatchdog) {
  // A blocking open of a FIFO that nobody writes never returns: `run` hung
  // until the sweep's watchdog ended it. Now it is one line, at once.
  expect_failure_then_recovery("fifo-output", "o.npy: is a FIFO, not a regular file", 5);
}

TEST(ExternalWorker, AHugeSparseOutputIsRefusedBySizeBeforeItIsRead) {
  // 4 GiB of holes with a header true to its size: once read whole before its
  // shape was checked (4.3 GB peak). Now refused by its size alone.
  rusage before{};
  ::getrusage(RUSAGE_SELF, &before);
  expect_failure_then_recovery("huge-output", "refused unread", 10);
  rusage after{};
  ::getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "the peak grew by " << after.ru_maxrss - before.ru_maxrss
                                                           << " KiB reading a refused output";
}

/// The processes whose command line contains `tag`. A process that exits while
/// its /proc entry is read (another test's, under ctest -j) is skipped: reading
/// a vanished entry fails with ESRCH, which libstdc++'s filebuf throws
/// ("basic_filebuf::underflow error reading the file: No such process"; CI,
/// 2026-11-26).
std::vector<pid_t> tagged(const std::string& tag) {
  std::vector<pid_t> found;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    try {
      std::ifstream in(entry.path() / "cmdline", std::ios::binary);
      const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::ifstream stat(entry.path() / "stat");
      std::string status;
      std::getline(stat, status);
      const std::size_t close = status.rfind(')');
      const bool zombie = close != std::string::npos && close + 2 < status.size() && status[close + 2] == 'Z';
      if (!zombie && cmdline.find(tag) != std::string::npos) found.push_back(std::stoi(name));
    } catch (const std::ios_base::failure&) {  // the process exited meanwhile: not one of the tagged
    }
  }
  return found;
}

TEST(ExternalWorker, ASetsidGrandchildDoesNotOutliveTheSubject) {
  const std::string tag = fmt::format("flashcheck-setsid-test-{}", ::getpid());
  WorkerSpec s = spec("setsid-child", 1);
  s.command += " --tag " + tag;
  {
    ExternalSubject subject(s);
    EXPECT_EQ(subject.run(kSmall, generate_inputs(kSmall)).status, Status::ok);
    const std::vector<pid_t> running = tagged(tag);
    ASSERT_EQ(running.size(), 2u) << "expected the worker and its setsid grandchild";
    bool left_the_session = false;
    for (int wait = 0; wait < 500 && !left_the_session; ++wait, ::usleep(10000))
      for (const pid_t pid : running) left_the_session |= ::getsid(pid) == pid;
    EXPECT_TRUE(left_the_session) << "the grandchild did not call setsid";
  }
  EXPECT_EQ(tagged(tag), std::vector<pid_t>{}) << "a process of the worker outlived it";
}

TEST(ExternalWorker, BadStartsAreOneClearError) {
  const auto expect_start_error = [](WorkerSpec s, const std::string& expected) {
    try {
      ExternalSubject subject(s);
      ADD_FAILURE() << s.command << " started";
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  expect_start_error(spec("bad-protocol"), "speaks protocol 99, this flashcheck speaks 1");
  expect_start_error(spec("bad-caps"), "unknown key 'warp_speed'");
  expect_start_error(spec("refuse"), "refused the handshake: no device here");
  expect_start_error(spec("exit"), "exiting before the handshake");  // quoted from its stderr
  expect_start_error(spec("noisy"), "malformed reply to the handshake");
  WorkerSpec missing = spec("good");
  missing.command = "flashcheck-no-such-worker --flag";
  expect_start_error(missing, "cannot run 'flashcheck-no-such-worker'");
  WorkerSpec piped = spec("good");
  piped.command = fake("good") + " | tee log";
  expect_start_error(piped, "unquoted shell operator");
}

TEST(ExternalWorker, ChildProcessesRegisterFromTheParentsHandshake) {
  ExternalSubject parent(spec("good"));
  const nlohmann::json registration = parent.registration();
  WorkerSpec child_spec = spec("good");
  ExternalSubject child(child_spec, registration.at("hello"));  // no handshake until its first case
  EXPECT_EQ(describe(child.capabilities()), describe(parent.capabilities()));
  const CaseResult result = judge(child, kSmall);
  EXPECT_TRUE(result.passed()) << explain(result);
}

TEST(ExternalConfig, ReadsWorkersAndNamesBadEntries) {
  const fs::path dir = fs::temp_directory_path() / "flashcheck-config-test";
  fs::create_directories(dir / "sub");
  std::ofstream(dir / "good.json") << R"({"workers": [{"name": "a", "cmd": "python3 w.py"},
                                                     {"name": "b", "cmd": "w", "cwd": "sub", "watchdog_s": 7}]})";
  const auto specs = read_config(dir / "good.json");
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].cwd, fs::absolute(dir));
  EXPECT_EQ(specs[1].cwd, fs::absolute(dir) / "sub");
  EXPECT_EQ(specs[1].watchdog_seconds, 7);
  std::ofstream(dir / "typo.json") << R"({"workers": [{"name": "a", "command": "w"}]})";
  EXPECT_THROW(read_config(dir / "typo.json"), std::runtime_error);
  std::ofstream(dir / "broken.json") << R"({"workers": [)";
  EXPECT_THROW(read_config(dir / "broken.json"), std::runtime_error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flashcheck::external
