// The machine's own ceilings, measured before any kernel is timed, so that
// every figure of a bench can be read as a fraction of what this GPU does:
// a large GEMM through cuBLAS (bf16 on the tensor cores; f32 without TF32, the
// fp32 kernels' ceiling), a device-to-device copy, and a read of a buffer
// that writes nothing (what a decode, which only reads K and V, can reach).
#pragma once

#include <string>

#include "flashcheck/core/record.hpp"

namespace flashcheck::reports {

struct Ceilings {
  std::string device;      // name, sm_XY, SM count
  double gemm_bf16_tflops = 0;
  double gemm_f32_tflops = 0;
  double copy_gbps = 0;    // bytes read + written per second
  double read_gbps = 0;    // bytes read per second by a kernel that writes one word a block
  double l2_bytes = 0;
  double free_bytes = 0;   // device memory free when measured
  std::string method;      // shapes and repetitions, for the record
};

/// Measures the ceilings on the current device (CUDA events, median of
/// `repeats` after warm-up). Throws std::runtime_error when no GPU is usable.
Ceilings measure_ceilings(int repeats);

/// The ceilings' record (`kind: ceiling`), timed now.
CeilingRecord to_record(const Ceilings& c);

}  // namespace flashcheck::reports
