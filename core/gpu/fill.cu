// The one kernel of the runtime: fills a buffer with a 16- or 32-bit pattern.
#include "flashcheck/core/gpu/runtime.hpp"

namespace flashcheck::gpu {
namespace {

template <typename Word>
__global__ void fill_pattern(Word* data, std::int64_t count, Word pattern) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    data[i] = pattern;
}

}  // namespace

void fill_words(void* data, std::int64_t count, int word_bytes, std::uint32_t pattern, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min<std::int64_t>((count + 255) / 256, 4096));
  if (blocks == 0) return;
  if (word_bytes == 4) fill_pattern<<<blocks, 256, 0, stream>>>(static_cast<std::uint32_t*>(data), count, pattern);
  else fill_pattern<<<blocks, 256, 0, stream>>>(static_cast<std::uint16_t*>(data), count, static_cast<std::uint16_t>(pattern));
}

}  // namespace flashcheck::gpu
