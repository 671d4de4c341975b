#include "flashcheck/cli/watchdog.hpp"

#include <fmt/core.h>

#include <cstdio>
#include <cstdlib>

#include "flashcheck/cli/commands.hpp"

namespace flashcheck::cli {

CaseWatchdog::CaseWatchdog() : thread_([this] { watch(); }) {}

CaseWatchdog::~CaseWatchdog() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CaseWatchdog::arm(double seconds, std::string what, std::function<void()> on_expiry) {
  {
    const std::lock_guard lock(mutex_);
    armed_ = true;
    seconds_ = seconds;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    what_ = std::move(what);
    on_expiry_ = std::move(on_expiry);
  }
  changed_.notify_all();
}

void CaseWatchdog::disarm() {
  {
    // Held by the watchdog's thread from the deadline on: a case that answers
    // just too late waits here for the process's end, and its record is not
    // written beside the timeout's.
    const std::lock_guard lock(mutex_);
    armed_ = false;
  }
  changed_.notify_all();
}

void CaseWatchdog::watch() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (!armed_) {
      changed_.wait(lock);
      continue;
    }
    if (changed_.wait_until(lock, deadline_) != std::cv_status::timeout || !armed_ || stopping_) continue;
    if (std::chrono::steady_clock::now() < deadline_) continue;
    fmt::print(stderr,
               "flashcheck: hang: {} gave no answer within {:.0f} s (--watchdog); a kernel that never ends cannot be "
               "stopped inside this process, so flashcheck stops here\n",
               what_, seconds_);
    if (on_expiry_) on_expiry_();
    std::fflush(nullptr);
    std::_Exit(kExitFail);
  }
}

}  // namespace flashcheck::cli
