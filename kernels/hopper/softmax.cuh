// The Hopper kernel's online softmax. The arithmetic is shared with the mma
// family (kernels/common/softmax.cuh), on the m16n8 C layout each warp's
// slice of a wgmma accumulator has. What is Hopper's own is the split, which
// lets the softmax of tile j run while the tensor cores compute O += P V of
// tile j - 1 (FlashAttention-3's intra-warpgroup overlap):
//   exponentiate(S_j)   max, exp2 and row sums: touches S and the row state only,
//                       so it may run while the PV wgmma reads P_{j-1} and writes O;
//   rescale(O)          O *= exp(old max - new max), after that wgmma completes;
//   to_fragments(S_j)   P_j as the register A operand of the next PV wgmma.
#pragma once

#include "common/softmax.cuh"

namespace flashcheck::kernels::hopper {

struct OnlineSoftmax {
  RowState state;
  float scale_log2;  // softmax scale * log2(e): the exponentials are exp2

  __device__ __forceinline__ explicit OnlineSoftmax(float scale) : scale_log2(scale * 1.4426950408889634f) {}

  template <int kTilesN>
  __device__ __forceinline__ Correction exponentiate(float (&s)[kTilesN][4]) {
    return kernels::exponentiate(s, state, scale_log2);
  }
  template <int kTilesD>
  __device__ __forceinline__ static void rescale(float (&o)[kTilesD][4], const Correction& correction) {
    kernels::rescale(o, correction);
  }
  template <typename T, int kTilesN>
  __device__ __forceinline__ static void to_fragments(const float (&s)[kTilesN][4], std::uint32_t (&p)[kTilesN / 2][4]) {
    kernels::to_fragments<T>(s, p);
  }
};

}  // namespace flashcheck::kernels::hopper
