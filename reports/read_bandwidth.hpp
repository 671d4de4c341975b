// The read-only bandwidth kernel of the ceilings (read_bandwidth.cu); private to reports/.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace flashcheck::reports::detail {

/// Blocks that fill `sm_count` SMs with 2048 threads each.
int read_all_blocks(int sm_count);

/// Reads `bytes` (a multiple of 16) at `data` once; each of `blocks` blocks
/// XORs its warps' folds into sink[block] (`blocks` words, zeroed by the caller).
cudaError_t launch_read_all(const void* data, std::size_t bytes, unsigned* sink, int blocks, cudaStream_t stream);

}  // namespace flashcheck::reports::detail
