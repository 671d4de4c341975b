#include "flashcheck/core/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>

#include "flashcheck/core/random.hpp"

namespace flashcheck {

double max_abs_finite(const HostTensor& tensor) {
  double largest = 0;
  for (std::int64_t n = 0; n < tensor.size(); ++n)
    if (const double x = std::abs(tensor.load(n)); std::isfinite(x)) largest = std::max(largest, x);
  return largest;
}

HostTensor::HostTensor(DType dtype, Layout layout, std::int64_t batch, std::int64_t heads, std::int64_t seqlen,
                       std::int64_t dim)
    : dtype_(dtype), layout_(layout), batch_(batch), heads_(heads), seqlen_(seqlen), dim_(dim) {
  if (dtype == DType::f32) single_.assign(size(), 0.0f);
  else if (is_fp8(dtype)) byte_.assign(size(), 0);
  else half_.assign(size(), 0);
}

void HostTensor::set_descale(double descale) {
  if (!(std::isfinite(descale) && descale > 0))
    throw std::invalid_argument("HostTensor::set_descale: the factor must be finite and > 0, not " +
                                std::to_string(descale));
  if (!is_fp8(dtype_) && descale != 1)
    throw std::invalid_argument("HostTensor::set_descale: only an fp8 tensor has a descale factor");
  descale_ = descale;
}

void HostTensor::read_row(std::int64_t b, std::int64_t h, std::int64_t s, double* out) const {
  const std::int64_t base = offset(b, h, s, 0);
  if (dtype_ == DType::f32) {
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = single_[base + c];
  } else if (is_fp8(dtype_)) {
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = load(base + c);
  } else {
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = half_bits_to_double(dtype_, half_[base + c]);
  }
}

void HostTensor::read_row(std::int64_t b, std::int64_t h, std::int64_t s, float* out) const {
  const std::int64_t base = offset(b, h, s, 0);
  if (dtype_ == DType::f32) {
    std::copy_n(single_.data() + base, dim_, out);
  } else if (is_fp8(dtype_)) {
    // An fp8 value times a power-of-two descale is exact in f32 (short of f32's range).
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = static_cast<float>(load(base + c));
  } else {
    // f16 and bf16 values are exact in f32.
    for (std::int64_t c = 0; c < dim_; ++c) out[c] = static_cast<float>(half_bits_to_double(dtype_, half_[base + c]));
  }
}

bool HostTensor::operator==(const HostTensor& other) const {
  if (dtype_ != other.dtype_ || layout_ != other.layout_ || batch_ != other.batch_ || heads_ != other.heads_ ||
      seqlen_ != other.seqlen_ || dim_ != other.dim_ || descale_ != other.descale_)
    return false;
  // An empty vector's data() may be null, and memcmp on null is undefined even for 0 bytes.
  return bytes() == 0 || std::memcmp(data(), other.data(), static_cast<std::size_t>(bytes())) == 0;
}

void HostTensor::poison() {
  if (dtype_ == DType::f32) std::fill(single_.begin(), single_.end(), std::numeric_limits<float>::quiet_NaN());
  else if (is_fp8(dtype_)) std::fill(byte_.begin(), byte_.end(), fp8_bits_from_double(dtype_, std::numeric_limits<double>::quiet_NaN()));
  else std::fill(half_.begin(), half_.end(), half_bits_from_double(dtype_, std::numeric_limits<double>::quiet_NaN()));
}

void HostTensor::fill(double value) {
  if (dtype_ == DType::f32) std::fill(single_.begin(), single_.end(), static_cast<float>(value));
  else if (is_fp8(dtype_)) std::fill(byte_.begin(), byte_.end(), fp8_bits_from_double(dtype_, value / descale_));
  else std::fill(half_.begin(), half_.end(), half_bits_from_double(dtype_, value));
}

Outputs make_outputs(const Problem& p) {
  Outputs out;
  out.o = HostTensor(output_dtype(p.dtype), p.layout, p.batch, p.heads_q, p.seqlen_q, p.head_dim_v);
  out.o.poison();
  out.lse.assign(p.lse_elements(), std::numeric_limits<float>::quiet_NaN());
  return out;
}

RowSet all_rows(const Problem& p) {
  RowSet set;
  set.rows.resize(p.seqlen_q);
  for (std::int64_t i = 0; i < p.seqlen_q; ++i) set.rows[i] = i;
  return set;
}

RowSet sample_rows(const Problem& p, std::int64_t count, std::uint64_t seed) {
  if (count >= p.seqlen_q) return all_rows(p);
  std::set<std::int64_t> chosen;
  auto add = [&](std::int64_t row) {
    if (row >= 0 && row < p.seqlen_q) chosen.insert(row);
  };
  add(0);
  add(p.seqlen_q - 1);
  for (std::int64_t b = 0; b < p.batch; ++b) {
    add(p.len_q(b) - 1);
    add(p.len_q(b) - 2);
  }
  // Tile edges of the tile sizes kernels use; the first few and the last few.
  for (std::int64_t tile : {16, 64, 128}) {
    for (std::int64_t edge = tile; edge < p.seqlen_q && edge <= 4 * tile; edge += tile) {
      add(edge - 1);
      add(edge);
    }
    const std::int64_t last_edge = (p.seqlen_q - 1) / tile * tile;
    add(last_edge - 1);
    add(last_edge);
  }
  CounterRng rng(seed, /*stream=*/0x726f7773);  // "rows"
  for (std::uint64_t draw = 0; static_cast<std::int64_t>(chosen.size()) < count; ++draw)
    add(static_cast<std::int64_t>(rng.bits(draw) % static_cast<std::uint64_t>(p.seqlen_q)));
  RowSet set;
  set.rows.assign(chosen.begin(), chosen.end());
  return set;
}

AttentionRows::AttentionRows(const Problem& p, RowSet row_set)
    : rows(std::move(row_set)), batch(p.batch), heads(p.heads_q), dim_v(p.head_dim_v) {
  o.assign(static_cast<std::size_t>(batch * heads * rows.size() * dim_v), 0.0);
  lse.assign(static_cast<std::size_t>(batch * heads * rows.size()), -std::numeric_limits<double>::infinity());
}

AttentionRows gather_rows(const Problem& p, const Outputs& outputs, const RowSet& rows) {
  AttentionRows gathered(p, rows);
  gathered.has_lse = outputs.has_lse;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h)
      for (std::int64_t r = 0; r < rows.size(); ++r) {
        const std::int64_t i = rows.rows[r];
        outputs.o.read_row(b, h, i, gathered.o_row(b, h, r));
        if (outputs.has_lse) gathered.lse[gathered.index(b, h, r)] = outputs.lse[(b * p.heads_q + h) * p.seqlen_q + i];
      }
  return gathered;
}

}  // namespace flashcheck
