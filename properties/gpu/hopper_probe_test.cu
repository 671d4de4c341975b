// Probes of the Hopper building blocks, each against a host computation, so
// that a wrong layout assumption (kernels/hopper/NOTES.md marks them
// UNCONFIRMED) shows up alone rather than as a wrong attention output:
//   1. a TMA box with the 128-byte swizzle lands where sw128(row, chunk) says;
//   2. S = Q K^T by SS wgmma (4 k16 steps in a 128-byte row) has the claimed
//      accumulator layout;
//   3. O = P V by RS wgmma, P converted from S's registers and V MN-major over
//      two 64-column panels (the leading byte offset), matches the host.
// One warpgroup, one block; SKIPPED without an sm_90 GPU.
#include <gtest/gtest.h>

#include <cuda_bf16.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "flashcheck/core/gpu/device_info.hpp"
#include "flashcheck/core/gpu/runtime.hpp"
#include "common/ptx.cuh"
#include "hopper/launch.cuh"

namespace flashcheck::kernels::hopper {
namespace {

constexpr int kRows = 64;  // query rows and keys
constexpr int kD = 128;    // V's width: two panels

struct ProbeMaps {
  CUtensorMap q, k, v;
};

__global__ void __launch_bounds__(128, 1)
    probe_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                 const __grid_constant__ CUtensorMap map_v, std::uint16_t* raw_q, float* s_out, float* o_out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  const std::uint32_t base = (smem_address(smem_raw) + 1023u) & ~1023u;
  const std::uint32_t q = base, k = q + kRows * 128, v = k + kRows * 128, bar = v + 2 * kRows * 128;
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_expect_bytes(bar, 4 * kRows * 128);
    tma_load_4d(q, &map_q, bar, 0, 0, 0, 0);
    tma_load_4d(k, &map_k, bar, 0, 0, 0, 0);
    tma_load_4d(v, &map_v, bar, 0, 0, 0, 0);
    tma_load_4d(v + kRows * 128, &map_v, bar, 64, 0, 0, 0);
  }
  mbarrier_wait(bar, 0);

  // 1. The raw bytes of Q's box.
  const unsigned char* q_bytes = smem_raw + (q - smem_address(smem_raw));
  for (int i = threadIdx.x; i < kRows * 64; i += 128) raw_q[i] = reinterpret_cast<const std::uint16_t*>(q_bytes)[i];

  // 2. S = Q K^T (d = 64: 4 steps of k16, 32 bytes each).
  float s[kRows / 8][4];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    Wgmma<kRows, true>::ss(s, sw128_descriptor(q + kk * 32, 16, 1024), sw128_descriptor(k + kk * 32, 16, 1024), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int j = 0; j < kRows / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s_out[(16 * warp + g + 8 * (e / 2)) * kRows + 8 * j + 2 * t + e % 2] = s[j][e];

  // 3. O = P V with P = bf16(S) from the registers, V [64 keys x 128] in two panels.
  std::uint32_t p[kRows / 16][4];
#pragma unroll
  for (int kc = 0; kc < kRows / 16; ++kc) {
    p[kc][0] = pack<__nv_bfloat16>(s[2 * kc][0], s[2 * kc][1]);
    p[kc][1] = pack<__nv_bfloat16>(s[2 * kc][2], s[2 * kc][3]);
    p[kc][2] = pack<__nv_bfloat16>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
    p[kc][3] = pack<__nv_bfloat16>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
  }
  float o[kD / 8][4] = {};
  wgmma_fence();
#pragma unroll
  for (int kc = 0; kc < kRows / 16; ++kc)
    Wgmma<kD, true>::rs(o, p[kc], sw128_descriptor(v + kc * 16 * 128, kRows * 128, 1024), 1);
  wgmma_commit();
  wgmma_wait<0>();
#pragma unroll
  for (int j = 0; j < kD / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_out[(16 * warp + g + 8 * (e / 2)) * kD + 8 * j + 2 * t + e % 2] = o[j][e];
#endif
}

std::uint32_t sw128(std::uint32_t row, std::uint32_t byte_in_row) {
  return row * 128u + ((((byte_in_row >> 4) ^ (row & 7u)) << 4) | (byte_in_row & 15u));
}

TEST(HopperProbe, TmaSwizzleAndWgmmaLayouts) {
  const GpuInventory gpus = gpu_devices();
  if (gpus.devices.empty()) GTEST_SKIP() << "no GPU: " << gpus.note;
  if (gpus.devices.front().compute_capability < 90) GTEST_SKIP() << "not an sm_90 GPU";
  const gpu::CallSite site{"hopper probe", ""};
  cudaFuncAttributes attributes{};
  gpu::check(cudaFuncGetAttributes(&attributes, probe_kernel), "cudaFuncGetAttributes", site);
  if (attributes.binaryVersion < 90) GTEST_SKIP() << "built without sm_90a";

  // Small integers and halves: exact in bf16, and their products and sums
  // exact in f32, so the comparisons are exact.
  std::vector<__nv_bfloat16> q(kRows * 64), k(kRows * 64), v(kRows * kD);
  std::vector<float> qf(q.size()), kf(k.size()), vf(v.size());
  for (int i = 0; i < kRows * 64; ++i) {
    qf[i] = static_cast<float>((i * 7 % 9) - 4) * 0.5f;
    kf[i] = static_cast<float>((i * 5 % 7) - 3) * 0.25f;
  }
  for (int i = 0; i < kRows * kD; ++i) vf[i] = static_cast<float>((i * 3 % 5) - 2);
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = __float2bfloat16(qf[i]);
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = __float2bfloat16(kf[i]);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = __float2bfloat16(vf[i]);

  gpu::DeviceBuffer dq(q.size() * 2, site), dk(k.size() * 2, site), dv(v.size() * 2, site);
  gpu::DeviceBuffer raw(kRows * 64 * 2, site), ds(kRows * kRows * 4, site), dout(kRows * kD * 4, site);
  gpu::check(cudaMemcpy(dq.get(), q.data(), q.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy", site);
  gpu::check(cudaMemcpy(dk.get(), k.data(), k.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy", site);
  gpu::check(cudaMemcpy(dv.get(), v.data(), v.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy", site);
  const CUtensorMap mq = tensor_map(dq.get(), true, 64, kRows, 1, 1, 64, kRows * 64, kRows * 64, kRows, site);
  const CUtensorMap mk = tensor_map(dk.get(), true, 64, kRows, 1, 1, 64, kRows * 64, kRows * 64, kRows, site);
  const CUtensorMap mv = tensor_map(dv.get(), true, kD, kRows, 1, 1, kD, kRows * kD, kRows * kD, kRows, site);
  const int smem = 1024 + 4 * kRows * 128 + 64;
  gpu::check(cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attribute", site);
  probe_kernel<<<1, 128, smem>>>(mq, mk, mv, static_cast<std::uint16_t*>(raw.get()), static_cast<float*>(ds.get()),
                                 static_cast<float*>(dout.get()));
  gpu::check_launch("probe_kernel", site);
  gpu::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", site);

  std::vector<std::uint16_t> raw_q(kRows * 64);
  std::vector<float> s(kRows * kRows), o(kRows * kD);
  gpu::check(cudaMemcpy(raw_q.data(), raw.get(), raw_q.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy", site);
  gpu::check(cudaMemcpy(s.data(), ds.get(), s.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy", site);
  gpu::check(cudaMemcpy(o.data(), dout.get(), o.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy", site);

  int swizzle_misses = 0;
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < 64; ++c) {
      std::uint16_t want;
      std::memcpy(&want, &q[r * 64 + c], 2);
      swizzle_misses += raw_q[sw128(r, c * 2) / 2] != want;
    }
  EXPECT_EQ(swizzle_misses, 0) << "the 128-byte swizzle formula does not match TMA's layout";

  int s_misses = 0, o_misses = 0;
  std::vector<float> p(kRows * kRows);
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kRows; ++j) {
      float want = 0;
      for (int c = 0; c < 64; ++c) want += qf[i * 64 + c] * kf[j * 64 + c];
      s_misses += s[i * kRows + j] != want;
      p[i * kRows + j] = __bfloat162float(__float2bfloat16(want));
    }
  EXPECT_EQ(s_misses, 0) << "S = Q K^T: descriptor, k-step or accumulator layout; S[0][1] = " << s[1];
  for (int i = 0; i < kRows; ++i)
    for (int c = 0; c < kD; ++c) {
      double want = 0;
      for (int j = 0; j < kRows; ++j) want += static_cast<double>(p[i * kRows + j]) * vf[j * kD + c];
      o_misses += std::fabs(o[i * kD + c] - want) > 1e-3 * (1 + std::fabs(want));
    }
  EXPECT_EQ(o_misses, 0) << "O = P V: the RS fragment, V's MN-major descriptor (LBO, SBO) or trans-b";
}

}  // namespace
}  // namespace flashcheck::kernels::hopper
