// The Hopper instructions the kernel uses, one wrapper each: mbarriers, TMA
// loads, wgmma fences and descriptors, setmaxnreg, named barriers. sm_90a
// only (the callers compile them under FLASHCHECK_SM90A). The layouts and
// encodings are in kernels/hopper/NOTES.md, with their sources.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace flashcheck::kernels::hopper {

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarriers ----------------------------------------------------------------

__device__ __forceinline__ void mbarrier_init(std::uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
/// Arrives once and adds `bytes` to the transaction count (the producer, before its TMA loads).
__device__ __forceinline__ void mbarrier_expect_bytes(std::uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(std::uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

/// A 4-byte store to shared memory at a 32-bit shared address.
__device__ __forceinline__ void store_shared(std::uint32_t address, std::uint32_t value) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(address), "r"(value) : "memory");
}

/// Two adjacent floats (8 bytes, 8-byte aligned) to shared memory at a 32-bit shared address.
__device__ __forceinline__ void store_shared_pair(std::uint32_t address, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(x), "f"(y) : "memory");
}

/// A 4-byte load from shared memory at a 32-bit shared address.
__device__ __forceinline__ std::uint32_t load_shared(std::uint32_t address) {
  std::uint32_t value;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(value) : "r"(address) : "memory");
  return value;
}

// ---- TMA ------------------------------------------------------------------------

/// Loads one box of a 4-D tensor map (coordinates innermost first, in
/// elements) into shared memory; completion counts its bytes on `bar`.
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const CUtensorMap* map, std::uint32_t bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

/// Stores one box of shared memory into a 4-D tensor map's tensor (the async
/// proxy reads it: writers must fence.proxy.async first). Rows past the
/// tensor's bounds are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, std::uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
/// Adds one box of shared memory to a 4-D tensor map's tensor, element by
/// element (each addition atomic; the backward's dQ share, f32). As
/// tma_store_4d: the async proxy reads the box (writers fence.proxy.async
/// first), and elements past the tensor's bounds are not touched.
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, std::uint32_t src, int c0, int c1, int c2,
                                                  int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// Waits until at most N of this thread's bulk stores still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
/// Waits until at most N of this thread's bulk stores are incomplete (global writes included).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/// Orders this thread's generic-proxy shared-memory writes before later
/// async-proxy operations (a TMA store) on them.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- wgmma ----------------------------------------------------------------------

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

/// A shared-memory matrix descriptor for a 128-byte-swizzled tile whose
/// 8-row groups start on 1024-byte boundaries (base offset 0). Addresses and
/// offsets are in bytes; the descriptor holds them in 16-byte units.
__device__ __forceinline__ std::uint64_t sw128_descriptor(std::uint32_t address, std::uint32_t leading,
                                                          std::uint32_t stride) {
  return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) |
         static_cast<std::uint64_t>((leading & 0x3FFFF) >> 4) << 16 |
         static_cast<std::uint64_t>((stride & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}

/// A descriptor moved `bytes` further into shared memory: its start address
/// field plus bytes / 16, which does not carry out of the field while the
/// address stays within shared memory (below 256 KiB).
__device__ __forceinline__ std::uint64_t descriptor_at(std::uint64_t descriptor, std::uint32_t bytes) {
  return descriptor + (bytes >> 4);
}

/// Pins registers a wgmma reads or writes asynchronously: the compiler may not
/// move their uses across this point (put after a wait_group, before a fence).
template <int N>
__device__ __forceinline__ void fence_operands(float (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(r[i][e])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operands(std::uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

// ---- registers and barriers -------------------------------------------------------

template <int kRegisters>
__device__ __forceinline__ void registers_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

/// Named barrier `id` (0 is __syncthreads's) over `threads` threads: wait
/// until that many have arrived, counting this warp's.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// Arrive on named barrier `id` without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/// A barrier over one warpgroup's 128 threads.
__device__ __forceinline__ void warpgroup_sync(int id) { named_barrier_sync(id, 128); }

}  // namespace flashcheck::kernels::hopper
