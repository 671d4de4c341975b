// Host tensors in their storage dtype and layout, and the per-row result form
// that oracles, baselines and subjects are compared in.
#pragma once

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/paging.hpp"
#include "flashcheck/core/problem.hpp"

namespace flashcheck {

/// A [batch, heads, seq, dim] tensor stored in `dtype` with the memory order of
/// `layout`. Values are exactly those the dtype can hold: set() rounds.
///
/// An fp8 tensor (e4m3, e5m2) is quantized with a per-tensor descale factor,
/// as serving stacks and cuDNN's fp8 SDPA keep them: element n's value is
/// stored(n) x descale(), and set(x) stores x / descale() rounded to the
/// format (saturating). The generators draw descales that are powers of two
/// (values.hpp), so that x / descale() and stored x descale() are exact in
/// f64 and f32. Every other dtype has descale 1, and get/load/read_row return
/// the value, descale applied, so that the oracles need no fp8 code of their
/// own; a kernel reads the stored bytes (data()) and the factor.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, Layout layout, std::int64_t batch, std::int64_t heads, std::int64_t seqlen, std::int64_t dim);

  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t heads() const { return heads_; }
  std::int64_t seqlen() const { return seqlen_; }
  std::int64_t dim() const { return dim_; }
  std::int64_t size() const { return batch_ * heads_ * seqlen_ * dim_; }
  std::int64_t bytes() const { return size() * storage_bytes(dtype_); }
  /// The factor that multiplies each stored element (1 unless fp8).
  double descale() const { return descale_; }
  /// Sets the factor (finite, > 0; an fp8 tensor only, else it must be 1).
  /// Stored elements are kept: their values scale with it. Throws
  /// std::invalid_argument otherwise.
  void set_descale(double descale);

  /// Element offset of (b, h, s, c) in storage order.
  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c) const {
    return layout_ == Layout::bhsd ? ((b * heads_ + h) * seqlen_ + s) * dim_ + c
                                   : ((b * seqlen_ + s) * heads_ + h) * dim_ + c;
  }
  double get(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c) const { return load(offset(b, h, s, c)); }
  /// Stores x rounded to the dtype.
  void set(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t c, double x) { store(offset(b, h, s, c), x); }
  /// Copies row (b, h, s) into out[0..dim) exactly (descale applied).
  void read_row(std::int64_t b, std::int64_t h, std::int64_t s, double* out) const;
  void read_row(std::int64_t b, std::int64_t h, std::int64_t s, float* out) const;

  /// Element n's value (descale applied).
  double load(std::int64_t index) const {
    switch (dtype_) {
      case DType::f32: return static_cast<double>(single_[index]);
      case DType::f16:
      case DType::bf16: return half_bits_to_double(dtype_, half_[index]);
      case DType::e4m3:
      case DType::e5m2: break;
    }
    return fp8_bits_to_double(dtype_, byte_[index]) * descale_;
  }
  /// Element n as stored, without the descale (fp8: the format's value).
  double stored(std::int64_t index) const { return is_fp8(dtype_) ? fp8_bits_to_double(dtype_, byte_[index]) : load(index); }
  void store(std::int64_t index, double x) {
    switch (dtype_) {
      case DType::f32: single_[index] = static_cast<float>(x); return;
      case DType::f16:
      case DType::bf16: half_[index] = half_bits_from_double(dtype_, x); return;
      case DType::e4m3:
      case DType::e5m2: break;
    }
    byte_[index] = fp8_bits_from_double(dtype_, x / descale_);
  }
  /// Fills every element with the dtype's quiet-NaN bit pattern.
  void poison();
  /// Every element set to `value` (rounded to the dtype).
  void fill(double value);

  /// Raw storage, for copies to a device.
  void* data() { return const_cast<void*>(std::as_const(*this).data()); }
  const void* data() const {
    if (dtype_ == DType::f32) return single_.data();
    return is_fp8(dtype_) ? static_cast<const void*>(byte_.data()) : static_cast<const void*>(half_.data());
  }

  /// Bitwise equality of dtype, layout, shape, descale and storage (NaN
  /// payloads included), as the determinism check needs.
  bool operator==(const HostTensor& other) const;

 private:
  DType dtype_ = DType::f32;
  Layout layout_ = Layout::bhsd;
  std::int64_t batch_ = 0, heads_ = 0, seqlen_ = 0, dim_ = 0;
  double descale_ = 1;
  std::vector<std::uint16_t> half_;
  std::vector<float> single_;
  std::vector<std::uint8_t> byte_;
};

/// The largest |x| over a tensor's finite elements (0 when it has none).
double max_abs_finite(const HostTensor& tensor);

/// The inputs of one call. With a paged problem (Problem::page_size > 0), k
/// and v are the pools, [pages.pages, heads_kv, page_size, dim] in the
/// problem's layout, and `pages` maps each sequence's keys into them
/// (paging.hpp; values.hpp's paged_inputs and logical_inputs convert); a
/// contiguous problem's table is empty.
struct Inputs {
  HostTensor q, k, v;
  PageTable pages;
};

/// What a subject returns: O in the problem's output_dtype (the input dtype,
/// bf16 for fp8 inputs) and layout, and LSE
/// (natural log, f32, [batch, heads_q, seqlen_q]).
struct Outputs {
  HostTensor o;
  std::vector<float> lse;
  bool has_lse = false;
};

/// Allocates outputs for a problem (O in output_dtype), O poisoned with NaN and LSE with NaN.
Outputs make_outputs(const Problem& problem);

/// A sorted set of query-row positions (within the padded seqlen_q) that a
/// comparison covers. Every row of attention is independent, so large problems
/// can be checked on a sample.
struct RowSet {
  std::vector<std::int64_t> rows;
  std::int64_t size() const { return static_cast<std::int64_t>(rows.size()); }
  bool operator==(const RowSet&) const = default;
};

/// Every row.
RowSet all_rows(const Problem& problem);
/// About `count` rows: always the first and last row (of the padded length and of
/// every sequence's valid length) and the rows at the edges of 16/64/128 tiles,
/// the rest drawn from `seed`. Returns all rows when count >= seqlen_q.
RowSet sample_rows(const Problem& problem, std::int64_t count, std::uint64_t seed);

/// O and LSE for the rows of a RowSet, in f64: [batch][heads_q][row][dv] and
/// [batch][heads_q][row]. Rows past a sequence's valid length are padding and
/// are not compared (their entries are 0 and -inf).
struct AttentionRows {
  RowSet rows;
  std::int64_t batch = 0, heads = 0, dim_v = 0;
  std::vector<double> o;
  std::vector<double> lse;
  bool has_lse = true;
  /// Optional (filled by the f64 oracle on request): how strongly the logits'
  /// rounding moves each result. Per row, sum_j p_j a_j; per element,
  /// sum_j p_j a_j (|V[j,c]| + |O[c]|); with a_j = scale sum_c |q_c k_jc| the
  /// absolute condition of logit j. Empty when not computed.
  std::vector<double> lse_condition;
  std::vector<double> o_condition;

  AttentionRows() = default;
  AttentionRows(const Problem& problem, RowSet row_set);
  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t r) const { return (b * heads + h) * rows.size() + r; }
  double* o_row(std::int64_t b, std::int64_t h, std::int64_t r) { return o.data() + index(b, h, r) * dim_v; }
  const double* o_row(std::int64_t b, std::int64_t h, std::int64_t r) const { return o.data() + index(b, h, r) * dim_v; }
};

/// Gathers a subject's outputs at the rows of a RowSet.
AttentionRows gather_rows(const Problem& problem, const Outputs& outputs, const RowSet& rows);

}  // namespace flashcheck
