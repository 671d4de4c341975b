// A GPU kept busy on a stream of its own, for the determinism checks: a
// kernel that spins on every SM while the subject under test runs on its own
// stream, so that the subject's blocks are scheduled among someone else's.
#pragma once

namespace flashcheck::testing_gpu {

class BusyStream {
 public:
  /// Creates a non-blocking stream (it neither waits for nor holds up the
  /// subject's). Throws std::runtime_error on a CUDA error.
  BusyStream();
  ~BusyStream();
  BusyStream(const BusyStream&) = delete;
  BusyStream& operator=(const BusyStream&) = delete;
  /// Launches a kernel of `blocks_per_sm` blocks of 256 threads per SM that
  /// spins for `milliseconds`, and returns at once.
  void start(int blocks_per_sm, int milliseconds);
  /// Waits for it to end.
  void finish();

 private:
  void* stream_ = nullptr;
  float* sink_ = nullptr;
  int multiprocessors_ = 1;
};

}  // namespace flashcheck::testing_gpu
