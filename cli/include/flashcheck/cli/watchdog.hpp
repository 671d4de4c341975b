// The deadline of the case in progress, for the commands that run subjects in
// their own process (`run`). A subject there cannot be stopped from inside
// the process once it hangs (a kernel in a deadlock or an endless loop keeps
// its device and its thread), so past the deadline the watchdog says so in
// one line on stderr, lets the command record the case as a timeout, and ends
// the process with exit code 1 (a hang is a failure). `fuzz` needs none of
// this: its subjects run in worker processes, which its own watchdog kills.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace flashcheck::cli {

class CaseWatchdog {
 public:
  CaseWatchdog();
  ~CaseWatchdog();
  CaseWatchdog(const CaseWatchdog&) = delete;
  CaseWatchdog& operator=(const CaseWatchdog&) = delete;

  /// Starts the clock of the case `what` (a subject and its problem line):
  /// unless disarm() comes within `seconds`, `on_expiry` runs (on the
  /// watchdog's thread, while the case is still stuck) and the process ends.
  void arm(double seconds, std::string what, std::function<void()> on_expiry);
  /// The case answered: no deadline until the next arm(). Once the deadline
  /// has passed it waits for the process's end instead (never returns).
  void disarm();

 private:
  void watch();

  std::mutex mutex_;
  std::condition_variable changed_;
  bool armed_ = false, stopping_ = false;
  std::chrono::steady_clock::time_point deadline_;
  double seconds_ = 0;
  std::string what_;
  std::function<void()> on_expiry_;
  std::thread thread_;  // last: started once the members it reads exist
};

}  // namespace flashcheck::cli
