#include "properties/mpfr_reference.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

#ifdef FLASHCHECK_HAVE_MPFR
#include <mpfr.h>
#endif

namespace flashcheck {

#ifndef FLASHCHECK_HAVE_MPFR

bool mpfr_available() { return false; }
MpfrAttention mpfr_attention(const Problem&, const Inputs&) {
  throw std::runtime_error("MPFR is not available: install libmpfr-dev");
}

#else

bool mpfr_available() { return true; }

namespace {

// An mpfr_t that frees itself.
class Big {
 public:
  Big() { mpfr_init2(value_, kMpfrBits); }
  explicit Big(double x) : Big() { mpfr_set_d(value_, x, MPFR_RNDN); }
  ~Big() { mpfr_clear(value_); }
  Big(const Big&) = delete;
  Big& operator=(const Big&) = delete;
  mpfr_ptr get() { return value_; }
  double to_double() const { return mpfr_get_d(value_, MPFR_RNDN); }

 private:
  mpfr_t value_;
};

// The mask read from the spec once more, for this reference alone.
bool sees(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) {
  const std::int64_t diagonal = i + lk - lq;
  if (p.mask == MaskKind::causal_tl) return j <= i;
  if (p.mask == MaskKind::causal_br) return j <= diagonal;
  if (p.mask == MaskKind::window)
    return (p.window_left < 0 || j >= diagonal - p.window_left) && (p.window_right < 0 || j <= diagonal + p.window_right);
  return true;
}

}  // namespace

MpfrAttention mpfr_attention(const Problem& p, const Inputs& in) {
  MpfrAttention result{AttentionRows(p, all_rows(p)), {}};
  result.abs_weighted.assign(result.rows.o.size(), 0.0);
  Big scale(p.softmax_scale), product, logit, maximum, weight, sum, numerator, abs_numerator, term;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size(), lq = p.len_q(b), lk = p.len_kv(b);
      for (std::int64_t i = 0; i < lq; ++i) {
        std::vector<std::int64_t> keys;
        for (std::int64_t j = 0; j < lk; ++j)
          if (sees(p, i, j, lq, lk)) keys.push_back(j);
        if (keys.empty()) continue;  // fully masked: O = 0, LSE = -inf as initialised
        std::vector<Big> logits(keys.size());
        mpfr_set_inf(maximum.get(), -1);
        for (std::size_t n = 0; n < keys.size(); ++n) {
          mpfr_set_zero(logit.get(), 1);
          for (std::int64_t c = 0; c < p.head_dim; ++c) {
            Big qc(in.q.get(b, h, i, c)), kc(in.k.get(b, hk, keys[n], c));
            mpfr_mul(product.get(), qc.get(), kc.get(), MPFR_RNDN);
            mpfr_add(logit.get(), logit.get(), product.get(), MPFR_RNDN);
          }
          mpfr_mul(logits[n].get(), logit.get(), scale.get(), MPFR_RNDN);
          mpfr_max(maximum.get(), maximum.get(), logits[n].get(), MPFR_RNDN);
        }
        // Weights exp(s - max), their sum, and the weighted sums of V and |V|.
        mpfr_set_zero(sum.get(), 1);
        std::vector<Big> weights(keys.size());
        for (std::size_t n = 0; n < keys.size(); ++n) {
          mpfr_sub(weight.get(), logits[n].get(), maximum.get(), MPFR_RNDN);
          mpfr_exp(weights[n].get(), weight.get(), MPFR_RNDN);
          mpfr_add(sum.get(), sum.get(), weights[n].get(), MPFR_RNDN);
        }
        for (std::int64_t c = 0; c < p.head_dim_v; ++c) {
          mpfr_set_zero(numerator.get(), 1);
          mpfr_set_zero(abs_numerator.get(), 1);
          for (std::size_t n = 0; n < keys.size(); ++n) {
            const double vc = in.v.get(b, hk, keys[n], c);
            Big value(vc), magnitude(std::fabs(vc));
            mpfr_mul(term.get(), weights[n].get(), value.get(), MPFR_RNDN);
            mpfr_add(numerator.get(), numerator.get(), term.get(), MPFR_RNDN);
            mpfr_mul(term.get(), weights[n].get(), magnitude.get(), MPFR_RNDN);
            mpfr_add(abs_numerator.get(), abs_numerator.get(), term.get(), MPFR_RNDN);
          }
          mpfr_div(numerator.get(), numerator.get(), sum.get(), MPFR_RNDN);
          mpfr_div(abs_numerator.get(), abs_numerator.get(), sum.get(), MPFR_RNDN);
          const auto at = static_cast<std::size_t>(result.rows.index(b, h, i) * p.head_dim_v + c);
          result.rows.o[at] = numerator.to_double();
          result.abs_weighted[at] = abs_numerator.to_double();
        }
        mpfr_log(term.get(), sum.get(), MPFR_RNDN);
        mpfr_add(term.get(), term.get(), maximum.get(), MPFR_RNDN);
        result.rows.lse[result.rows.index(b, h, i)] = term.to_double();
      }
    }
  return result;
}

#endif

}  // namespace flashcheck
