// GPU subjects that misbehave the way a broken kernel does, for the sweep's
// isolation and sanitizer tests (fixtures, linked only into
// flashcheck-testing; neither `all` nor `mutants` includes them):
//   misbehave-gpu-fault       writes far outside any allocation: a sticky
//                             "illegal address" that poisons the context;
//   misbehave-gpu-misaligned  a 16-byte load from an address 4 bytes off: a
//                             sticky "misaligned address";
//   misbehave-gpu-hang        a kernel that never finishes (the watchdog);
//   misbehave-gpu-race        threads write one shared word with no barrier
//                             between the writes and a read (racecheck's
//                             hazard); its output is zeros, so it also fails.
#include "flashcheck/core/gpu/gpu_subject.hpp"
#include "properties/fuzz/misbehaving.hpp"

namespace flashcheck {
namespace {

__global__ void write_far_away(float* out) { out[threadIdx.x + (std::int64_t{1} << 40) / sizeof(float)] = 1.0f; }

__global__ void load_misaligned(const float* in, float* out) {
  const float4* bad = reinterpret_cast<const float4*>(in + 1);  // 4 bytes past a 16-byte boundary
  const float4 got = bad[threadIdx.x];                            // every lane used: one 16-byte load
  out[threadIdx.x] = got.x + got.y + got.z + got.w;
}

__device__ int g_released = 0;  // nothing sets it

__global__ void spin_forever() {
  while (atomicAdd(&g_released, 0) == 0) __nanosleep(1000);
}

/// Writes zeros to the output, racing on shared memory on the way: each thread
/// reads a word that a thread of the next warp writes, with no barrier.
__global__ void race_on_shared(float* out, std::int64_t count) {
  __shared__ float words[128];
  words[threadIdx.x] = static_cast<float>(threadIdx.x);
  const float seen = static_cast<volatile float*>(words)[(threadIdx.x + 32) % 128];
  for (std::int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
    out[i] = seen * 0.0f;
}

using fixtures::kSmallGpuDomain;

class MisbehavingGpu final : public gpu::GpuSubject {
 public:
  enum class How { fault, misaligned, hang, race };
  MisbehavingGpu(std::string_view name, std::string_view description, How how)
      : name_(name), description_(description), how_(how) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  const Capabilities& capabilities() const override { return kSmallGpuDomain; }

 private:
  void launch(const Problem& p, const gpu::AttentionArgs& args, const gpu::CallSite& site) override {
    float* out = static_cast<float*>(args.o);
    switch (how_) {
      case How::fault:
        write_far_away<<<1, 32, 0, args.stream>>>(out);
        gpu::check_launch("write_far_away", site);
        break;
      case How::misaligned:
        load_misaligned<<<1, 32, 0, args.stream>>>(static_cast<const float*>(args.q), out);
        gpu::check_launch("load_misaligned", site);
        break;
      case How::hang:
        spin_forever<<<1, 1, 0, args.stream>>>();
        gpu::check_launch("spin_forever", site);
        break;
      case How::race:
        race_on_shared<<<4, 128, 0, args.stream>>>(out, p.batch * p.heads_q * p.seqlen_q * p.head_dim_v);
        gpu::check_launch("race_on_shared", site);
        break;
    }
  }

  std::string_view name_, description_;
  How how_;
};

FixtureRegistration fault([] {
  return std::make_unique<MisbehavingGpu>("misbehave-gpu-fault", "writes 1 TiB past its output (an illegal address)",
                                          MisbehavingGpu::How::fault);
});
FixtureRegistration misaligned([] {
  return std::make_unique<MisbehavingGpu>("misbehave-gpu-misaligned", "a float4 load 4 bytes off alignment",
                                          MisbehavingGpu::How::misaligned);
});
FixtureRegistration hang([] {
  return std::make_unique<MisbehavingGpu>("misbehave-gpu-hang", "a kernel that never finishes",
                                          MisbehavingGpu::How::hang);
});
FixtureRegistration race([] {
  return std::make_unique<MisbehavingGpu>("misbehave-gpu-race", "a shared-memory write-read race; writes zeros",
                                          MisbehavingGpu::How::race);
});

}  // namespace
}  // namespace flashcheck
