// core/process: exec failures, exit statuses and signals, timeouts that end
// the whole group, descendants that leave the group (setsid) under the
// subreaper, EINTR during waits, and writes larger than a pipe.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "flashcheck/core/process.hpp"

namespace flashcheck {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

ProcessOptions sh(const std::string& script) {
  ProcessOptions options;
  options.argv = {"/bin/sh", "-c", script};
  return options;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// Whether `pid` names a process that has not ended (a zombie has ended).
bool alive(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text;
  if (!std::getline(stat, text)) return false;
  const std::size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z';
}

/// Waits up to `seconds` for `pid` to end.
bool ends_within(pid_t pid, double seconds) {
  const auto start = Clock::now();
  while (alive(pid))
    if (seconds_since(start) > seconds) return false;
    else ::usleep(10000);
  return true;
}

TEST(Process, ReportsExecFailureWithErrno) {
  ProcessOptions missing;
  missing.argv = {"flashcheck-no-such-program"};
  try {
    Process child(missing);
    FAIL() << "a missing program started";
  } catch (const ProcessError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot run 'flashcheck-no-such-program'"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("No such file"), std::string::npos) << error.what();
  }
  // A path that exists but cannot be executed: the exec's own errno, reported
  // through the close-on-exec pipe.
  const fs::path script = fs::temp_directory_path() / fmt::format("flashcheck-process-noexec-{}", ::getpid());
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  fs::permissions(script, fs::perms::owner_read | fs::perms::owner_write);
  ProcessOptions denied;
  denied.argv = {script.string()};
  try {
    Process child(denied);
    FAIL() << "a file without execute permission started";
  } catch (const ProcessError& error) {
    EXPECT_NE(std::string(error.what()).find("Permission denied"), std::string::npos) << error.what();
  }
  fs::remove(script);
  ProcessOptions nowhere = sh("exit 0");
  nowhere.cwd = "/flashcheck-no-such-folder";
  try {
    Process child(nowhere);
    FAIL() << "a child started in a missing folder";
  } catch (const ProcessError& error) {
    EXPECT_NE(std::string(error.what()).find("in /flashcheck-no-such-folder: cannot enter the folder"),
              std::string::npos)
        << error.what();
  }
}

TEST(Process, ReportsExitStatusAndSignal) {
  Finished three = run_process(sh("exit 3"), std::nullopt, 10);
  EXPECT_FALSE(three.timed_out);
  EXPECT_TRUE(three.status.exited());
  EXPECT_EQ(three.status.code(), 3);
  EXPECT_EQ(three.status.describe(), "exited with status 3");
  Finished segv = run_process(sh("kill -SEGV $$"), std::nullopt, 10);
  EXPECT_TRUE(segv.status.signaled());
  EXPECT_EQ(segv.status.signal(), SIGSEGV);
  EXPECT_EQ(segv.status.code(), -1);
  EXPECT_NE(segv.status.describe().find("killed by signal 11"), std::string::npos) << segv.status.describe();
}

TEST(Process, PassesArgvWithoutAShellAndSetsTheEnvironment) {
  ProcessOptions options;
  options.argv = {"/bin/echo", "a b", "$HOME", "*"};
  options.out = Redirect::pipe();
  EXPECT_EQ(run_process(options, std::nullopt, 10).out, "a b $HOME *\n");
  ProcessOptions env = sh("echo \"$FLASHCHECK_A/$FLASHCHECK_B/$HOME\"");
  env.env = {{"FLASHCHECK_A", "set"}, {"HOME", "replaced"}};
  env.env_defaults = {{"FLASHCHECK_B", "default"}, {"HOME", "not this"}};
  env.out = Redirect::pipe();
  EXPECT_EQ(run_process(env, std::nullopt, 10).out, "set/default/replaced\n");
}

TEST(Process, RedirectsToFilesAndNull) {
  const fs::path log = fs::temp_directory_path() / fmt::format("flashcheck-process-log-{}", ::getpid());
  ProcessOptions options = sh("echo out; echo err >&2");
  options.out = Redirect::null();
  options.err = Redirect::file(log);
  run_process(options, std::nullopt, 10);
  run_process(options, std::nullopt, 10);  // appended
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "err\nerr\n");
  fs::remove(log);
}

TEST(Process, TimeoutKillsTheWholeGroup) {
  // sh starts a background sleep (same group) and waits on it; the timeout
  // must end both, not only sh.
  ProcessOptions options = sh("sleep 60 & echo $!; wait");
  options.out = Redirect::pipe();
  const auto start = Clock::now();
  Process child(options);
  std::string line;
  ASSERT_EQ(child.read_line(line, 10, 100), Process::Line::line);
  const pid_t sleeper = std::stoi(line);
  EXPECT_TRUE(alive(sleeper));
  EXPECT_EQ(child.read_line(line, 0.3, 100), Process::Line::timeout);
  EXPECT_FALSE(child.wait_for(0.1));
  const ExitStatus status = child.kill();
  EXPECT_EQ(status.signal(), SIGKILL);
  EXPECT_TRUE(ends_within(sleeper, 5)) << "the group's sleep outlived the kill";
  EXPECT_LT(seconds_since(start), 5);

  const auto begun = Clock::now();
  Finished finished = run_process(sh("sleep 60"), std::nullopt, 0.3);
  EXPECT_TRUE(finished.timed_out);
  EXPECT_EQ(finished.status.signal(), SIGKILL);
  EXPECT_LT(seconds_since(begun), 5);
}

// A grandchild that calls setsid leaves the group, so the group kill misses
// it; under the subreaper it is re-parented here and killed too.
pid_t setsid_grandchild(bool reap_descendants) {
  ProcessOptions options = sh("setsid sleep 60 & echo $!; wait");
  options.out = Redirect::pipe();
  options.reap_descendants = reap_descendants;
  Process child(options);
  std::string line;
  EXPECT_EQ(child.read_line(line, 10, 100), Process::Line::line);
  const pid_t grandchild = std::stoi(line);
  for (int i = 0; i < 200 && ::getsid(grandchild) != grandchild; ++i) ::usleep(10000);  // setsid has run
  EXPECT_EQ(::getsid(grandchild), grandchild) << "the grandchild did not call setsid";
  child.kill();
  return grandchild;
}

TEST(Process, SetsidGrandchildDoesNotOutliveTheRunUnderTheSubreaper) {
  // Without the subreaper it escapes (this is what the test guards against)...
  const pid_t escaped = setsid_grandchild(false);
  EXPECT_TRUE(alive(escaped)) << "a setsid grandchild was expected to escape a plain group kill";
  ::kill(escaped, SIGKILL);
  // ... with it, nothing is left once kill() returns (it has been reaped here).
  const pid_t grandchild = setsid_grandchild(true);
  EXPECT_FALSE(alive(grandchild)) << "the setsid grandchild " << grandchild << " outlived kill()";
}

TEST(Process, OrphanedDescendantsOfAChildThatExitedAreReaped) {
  // The child exits by itself, leaving a double-forked daemon: kill() (after
  // the child has ended) still ends it.
  ProcessOptions options = sh("(setsid sleep 60 & echo $!) ; exit 0");
  options.out = Redirect::pipe();
  options.reap_descendants = true;
  Process child(options);
  std::string line;
  ASSERT_EQ(child.read_line(line, 10, 100), Process::Line::line);
  const pid_t daemon = std::stoi(line);
  ASSERT_TRUE(child.wait_for(10));
  EXPECT_EQ(child.status()->code(), 0);
  EXPECT_TRUE(alive(daemon));
  child.kill();
  EXPECT_FALSE(alive(daemon)) << "the orphaned daemon outlived kill()";
}

TEST(Process, LiveSiblingsAreLeftAlone) {
  // Killing one child must not end another child's running descendants.
  ProcessOptions options = sh("setsid sleep 60 & echo $!; wait");
  options.out = Redirect::pipe();
  options.reap_descendants = true;
  Process kept(options);
  std::string line;
  ASSERT_EQ(kept.read_line(line, 10, 100), Process::Line::line);
  const pid_t sibling = std::stoi(line);
  {
    Process other(options);
    ASSERT_EQ(other.read_line(line, 10, 100), Process::Line::line);
  }  // other and its grandchild end here
  EXPECT_TRUE(alive(sibling));
  EXPECT_TRUE(alive(kept.pid()));
  kept.kill();
  EXPECT_FALSE(alive(sibling));
}

TEST(Process, DiesWithTheThreadThatStartedIt) {
  // PR_SET_PDEATHSIG fires when the starting thread ends (Linux ties it to
  // the thread): a child started from a thread that then exits is killed,
  // which is what a killed parent process does to it too.
  pid_t pid = -1;
  Process* leaked = nullptr;  // not destroyed: its destructor would kill the child itself
  std::thread starter([&] {
    leaked = new Process(sh("sleep 60"));
    pid = leaked->pid();
  });
  starter.join();
  ASSERT_GT(pid, 0);
  EXPECT_TRUE(ends_within(pid, 5)) << "the child outlived the thread that started it";
  const auto status = leaked->wait_for(5);
  ASSERT_TRUE(status);
  EXPECT_EQ(status->signal(), SIGKILL);
  delete leaked;
}

extern "C" void on_alarm(int) {}

TEST(Process, WaitsGoOnThroughSignals) {
  // SIGALRM every millisecond, without SA_RESTART: every poll, read and
  // waitpid sees EINTR, and must carry on.
  struct sigaction action {};
  action.sa_handler = on_alarm;
  struct sigaction previous {};
  ::sigaction(SIGALRM, &action, &previous);
  itimerval every_ms{{0, 1000}, {0, 1000}};
  ::setitimer(ITIMER_REAL, &every_ms, nullptr);
  ProcessOptions options = sh("sleep 0.3; echo late; read line; echo \"got $line\"; exit 7");
  options.in = Redirect::pipe();
  options.out = Redirect::pipe();
  Process child(options);
  std::string line;
  EXPECT_EQ(child.read_line(line, 10, 100), Process::Line::line);
  EXPECT_EQ(line, "late");
  EXPECT_TRUE(child.write_all("x\n", 10));
  EXPECT_EQ(child.read_line(line, 10, 100), Process::Line::line);
  EXPECT_EQ(line, "got x");
  const auto status = child.wait_for(10);
  itimerval off{};
  ::setitimer(ITIMER_REAL, &off, nullptr);
  ::sigaction(SIGALRM, &previous, nullptr);
  ASSERT_TRUE(status);
  EXPECT_EQ(status->code(), 7);
}

TEST(Process, WritesMoreThanAPipeHolds) {
  // 8 MiB through a 64 KiB pipe: the writes are short and must go on; stdout
  // is drained meanwhile.
  ProcessOptions options;
  options.argv = {"wc", "-c"};
  options.out = Redirect::pipe();
  const std::string input(8 << 20, 'x');
  Finished finished = run_process(options, input, 30);
  EXPECT_EQ(finished.status.code(), 0);
  EXPECT_EQ(std::stol(finished.out), 8l << 20);
  // The same through write_all, with cat echoing it back.
  ProcessOptions cat;
  cat.argv = {"cat"};
  cat.in = Redirect::pipe();
  cat.out = Redirect::null();
  Process child(cat);
  EXPECT_TRUE(child.write_all(input, 30));
  child.close_stdin();
  ASSERT_TRUE(child.wait_for(10));
  EXPECT_EQ(child.status()->code(), 0);
}

TEST(Process, WriteToAChildThatLeftFailsWithoutSigpipe) {
  ProcessOptions options = sh("exit 0");
  options.in = Redirect::pipe();
  Process child(options);
  ASSERT_TRUE(child.wait_for(10));
  EXPECT_FALSE(child.write_all(std::string(1 << 20, 'x'), 5));  // EPIPE, not the end of this test
}

TEST(Process, WriteToAChildThatDoesNotReadTimesOut) {
  ProcessOptions options = sh("sleep 60");
  options.in = Redirect::pipe();
  Process child(options);
  const auto start = Clock::now();
  EXPECT_FALSE(child.write_all(std::string(4 << 20, 'x'), 0.3));
  EXPECT_LT(seconds_since(start), 5);
}

TEST(Process, LinesLongerThanTheLimitAreReported) {
  ProcessOptions options = sh("head -c 300000 /dev/zero | tr '\\0' x; sleep 60");
  options.out = Redirect::pipe();
  Process child(options);
  std::string line;
  EXPECT_EQ(child.read_line(line, 10, 100000), Process::Line::too_long);
  ProcessOptions closed = sh("printf 'partial'");
  closed.out = Redirect::pipe();
  Process quiet(closed);
  EXPECT_EQ(quiet.read_line(line, 10, 100), Process::Line::closed);
}

}  // namespace
}  // namespace flashcheck
