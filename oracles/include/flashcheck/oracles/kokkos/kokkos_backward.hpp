// kokkos: the portable gradient reference, FlashAttention-2's backward pass.
//
// cpu_f64_gradients forms P = softmax(S) whole rows at a time with BLAS and
// takes D_i = sum_j P_ij dP_ij. This is Algorithm 2 of the FlashAttention-2
// paper (Dao, 2023) in f64, written against Kokkos execution spaces as the
// forward Kokkos reference is (the same source on Serial and on CUDA):
//   - its own f64 forward (the online-softmax kernel of kokkos_attention.hpp)
//     gives O and the row's LSE for every query row: the exact function's
//     gradient, not that of the rounded O a subject is handed;
//   - D_i = rowsum(dO_i o O_i);
//   - per key block (one team per (batch, K/V head, Bc key rows)), the query
//     rows of every head of the GQA group in tiles of Br: S and P =
//     exp(S - LSE_i) recomputed, dV += P^T dO, dP = dO V^T, dS = P o (dP - D),
//     dK += scale dS^T Q. Each dK/dV row is owned by one team, summed over
//     the group's heads and the query tiles in a fixed order: no atomics;
//   - dQ in a second kernel, one team per (batch, query head, Br query rows),
//     the key tiles in order: dQ += scale dS K (FlashAttention-2 adds dQ with
//     atomics in the key-block loop; a second pass keeps it deterministic).
// Masks, varlen and padding are this file's own reading of the Problem (the
// mask code of kokkos_attention.hpp); nothing is shared with cpu_f64 or
// kernels/. Fully masked query rows and padding rows have dQ = 0 and
// contribute nothing to dK and dV; masked (query, key) pairs are absent,
// never multiplied by zero (non-finite inputs stay where IEEE puts them).
//
// On a GPU it checks the gradients on every row of a problem where cpu_f64
// samples (docs/kokkos-cuda.md, "The backward").
#pragma once

#include <cstdint>

#include "flashcheck/core/gradients.hpp"
#include "flashcheck/core/tensor.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck {

/// The (query row, key) pairs the Kokkos gradient kernels hold at once by
/// default: 2^24, 256 MiB of f64 pairs.
inline constexpr std::int64_t kKokkosPairBudget = std::int64_t{1} << 24;

/// The f64 gradients by FlashAttention-2's Algorithm 2, dQ on `q_rows` and
/// dK, dV on `kv_rows` (any sorted row sets; all_rows and all_key_rows for
/// every row), for the upstream gradient `dout` ([batch, heads_q, seqlen_q,
/// dv], any dtype and layout), in the given space. `tiling` sets Br
/// (rows_per_team: query rows per tile), Bc (key_tile: key rows per block)
/// and the team size of both kernels; on a GPU they are halved until the team
/// scratch fits (kokkos_fitted_gradient_tiling). The forward inside runs with
/// the forward reference's default tiling. Throws std::runtime_error when
/// Kokkos (or, for KokkosSpace::device, a device) is not available, or
/// std::invalid_argument for a tiling outside [1, 1024]. With
/// `with_condition`, the result also holds the conditioning of the gradients
/// (GradientRows::dq_terms_max and the rest, as cpu_f64_gradients records
/// them: dQ's over `q_rows`, dK's and dV's over `kv_rows`), by plain f64
/// kernels: one work item per (row, key) pair for the products, then one per
/// row and per key for the sums. `pair_budget` bounds the pairs held at once
/// (16 bytes each): the rows go in chunks of pair_budget / seqlen_kv, at
/// least one (std::invalid_argument below 1).
GradientRows kokkos_gradients(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                              const RowSet& q_rows, const RowSet& kv_rows, KokkosTiling tiling = {},
                              KokkosSpace space = KokkosSpace::host, bool with_condition = false,
                              std::int64_t pair_budget = kKokkosPairBudget);

/// The same-precision gradient baseline of cpu_lowp_gradients (the plain
/// backward in f32, rounded to `working` after each step) on `q_rows` and
/// `kv_rows`, in the given space: one work item per (query row, key) pair
/// (its logit and dP), one per query row (its softmax state, D and dS, sums
/// in key order), one per (query row, column) of dQ, then one per key row (dK
/// and dV over the rows in index order); the pairs go in chunks of rows as
/// kokkos_gradients' (12 bytes a pair). On the host it gives
/// cpu_lowp_gradients' values; on a GPU it lets a backward case be judged on
/// every row. Throws std::runtime_error as kokkos_gradients does.
GradientRows kokkos_gradient_baseline(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                                      const RowSet& q_rows, const RowSet& kv_rows, DType working,
                                      KokkosSpace space = KokkosSpace::host,
                                      std::int64_t pair_budget = kKokkosPairBudget);

/// The tiling kokkos_gradients will use for this problem in this space.
KokkosTiling kokkos_fitted_gradient_tiling(const Problem& problem, KokkosTiling tiling, KokkosSpace space);

}  // namespace flashcheck
