#include "properties/mpfr_reference.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <vector>

#ifdef FLASHCHECK_HAVE_MPFR
#include <mpfr.h>
#endif

namespace flashcheck {

#ifndef FLASHCHECK_HAVE_MPFR

bool mpfr_available() { return false; }
MpfrAttention mpfr_attention(const Problem&, const Inputs&) {
  throw std::runtime_error("MPFR is not available: install libmpfr-dev");
}
GradientRows mpfr_gradients(const Problem&, const Inputs&, const HostTensor&) {
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
bool sees_key(const Problem& p, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk) {
  const std::int64_t diagonal = i + lk - lq;
  if (p.mask == MaskKind::causal_tl) return j <= i;
  if (p.mask == MaskKind::causal_br) return j <= diagonal;
  if (p.mask == MaskKind::window)
    return (p.window_left < 0 || j >= diagonal - p.window_left) && (p.window_right < 0 || j <= diagonal + p.window_right);
  return true;
}

// The score modifications (Problem::softcap, then Problem::alibi) read from
// the spec once more, at kMpfrBits: s <- C tanh(s / C), s <- s - slope_h
// |i + lk - lq - j|. `chain` (where given) receives d(modified)/d(s).
void modify_logit(const Problem& p, std::int64_t h, std::int64_t i, std::int64_t j, std::int64_t lq, std::int64_t lk,
                  Big& s, Big* chain) {
  if (chain) mpfr_set_ui(chain->get(), 1, MPFR_RNDN);
  if (p.softcap > 0) {
    Big cap(p.softcap), t;
    mpfr_div(t.get(), s.get(), cap.get(), MPFR_RNDN);
    mpfr_tanh(t.get(), t.get(), MPFR_RNDN);
    mpfr_mul(s.get(), t.get(), cap.get(), MPFR_RNDN);
    if (chain) {
      mpfr_sqr(t.get(), t.get(), MPFR_RNDN);
      mpfr_ui_sub(chain->get(), 1, t.get(), MPFR_RNDN);
    }
  }
  if (p.alibi) {
    std::int64_t m = 1;  // the largest power of two <= heads_q
    while (m * 2 <= p.heads_q) m *= 2;
    const double exponent = h < m ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(m)
                                  : -4.0 * static_cast<double>(2 * (h - m) + 1) / static_cast<double>(m);
    Big slope(exponent), bias(static_cast<double>(std::abs(i + lk - lq - j)));
    mpfr_exp2(slope.get(), slope.get(), MPFR_RNDN);
    mpfr_mul(bias.get(), bias.get(), slope.get(), MPFR_RNDN);
    mpfr_sub(s.get(), s.get(), bias.get(), MPFR_RNDN);
  }
}

}  // namespace

MpfrAttention mpfr_attention(const Problem& p, const Inputs& in) {
  // Element c of key j of sequence b, through the page table when paged.
  const auto key_element = [&](const HostTensor& t, std::int64_t b, std::int64_t hk, std::int64_t j, std::int64_t c) {
    if (p.page_size == 0) return t.get(b, hk, j, c);
    return t.get(in.pages.entries[static_cast<std::size_t>(b * in.pages.per_sequence + j / p.page_size)], hk,
                 j % p.page_size, c);
  };
  MpfrAttention result{AttentionRows(p, all_rows(p)), {}};
  result.abs_weighted.assign(result.rows.o.size(), 0.0);
  Big scale(p.softmax_scale), product, logit, maximum, weight, sum, numerator, abs_numerator, term;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const std::int64_t hk = h / p.group_size(), lq = p.len_q(b), lk = p.len_kv(b);
      for (std::int64_t i = 0; i < lq; ++i) {
        std::vector<std::int64_t> keys;
        for (std::int64_t j = 0; j < lk; ++j)
          if (sees_key(p, i, j, lq, lk)) keys.push_back(j);
        if (keys.empty()) continue;  // fully masked: O = 0, LSE = -inf as initialised
        std::vector<Big> logits(keys.size());
        mpfr_set_inf(maximum.get(), -1);
        for (std::size_t n = 0; n < keys.size(); ++n) {
          mpfr_set_zero(logit.get(), 1);
          for (std::int64_t c = 0; c < p.head_dim; ++c) {
            Big qc(in.q.get(b, h, i, c)), kc(key_element(in.k, b, hk, keys[n], c));
            mpfr_mul(product.get(), qc.get(), kc.get(), MPFR_RNDN);
            mpfr_add(logit.get(), logit.get(), product.get(), MPFR_RNDN);
          }
          mpfr_mul(logits[n].get(), logit.get(), scale.get(), MPFR_RNDN);
          modify_logit(p, h, i, keys[n], lq, lk, logits[n], nullptr);
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
            const double vc = key_element(in.v, b, hk, keys[n], c);
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

GradientRows mpfr_gradients(const Problem& p, const Inputs& in, const HostTensor& dout) {
  GradientRows result(p, all_rows(p), all_key_rows(p));
  const std::int64_t d = p.head_dim, dv = p.head_dim_v;
  Big scale(p.softmax_scale), product, maximum, shifted, sum, delta, difference, term;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
    for (std::int64_t hk = 0; hk < p.heads_kv; ++hk) {
      // dK and dV of this K/V head, summed over its group's heads and every row.
      std::vector<Big> dk(static_cast<std::size_t>(lk * d)), dvalue(static_cast<std::size_t>(lk * dv));
      for (Big& x : dk) mpfr_set_zero(x.get(), 1);
      for (Big& x : dvalue) mpfr_set_zero(x.get(), 1);
      for (std::int64_t h = hk * p.group_size(); h < (hk + 1) * p.group_size(); ++h)
        for (std::int64_t i = 0; i < lq; ++i) {
          std::vector<std::int64_t> keys;
          for (std::int64_t j = 0; j < lk; ++j)
            if (sees_key(p, i, j, lq, lk)) keys.push_back(j);
          if (keys.empty()) continue;  // fully masked: no gradient, no contribution
          const std::size_t n = keys.size();
          // S = scale Q K^T and its maximum; P = exp(S - max) / sum.
          std::vector<Big> prob(n), dprob(n), ds(n), chain(n);
          mpfr_set_inf(maximum.get(), -1);
          for (std::size_t t = 0; t < n; ++t) {
            mpfr_set_zero(prob[t].get(), 1);
            for (std::int64_t c = 0; c < d; ++c) {
              Big qc(in.q.get(b, h, i, c)), kc(in.k.get(b, hk, keys[t], c));
              mpfr_mul(product.get(), qc.get(), kc.get(), MPFR_RNDN);
              mpfr_add(prob[t].get(), prob[t].get(), product.get(), MPFR_RNDN);
            }
            mpfr_mul(prob[t].get(), prob[t].get(), scale.get(), MPFR_RNDN);
            modify_logit(p, h, i, keys[t], lq, lk, prob[t], &chain[t]);
            mpfr_max(maximum.get(), maximum.get(), prob[t].get(), MPFR_RNDN);
          }
          mpfr_set_zero(sum.get(), 1);
          for (std::size_t t = 0; t < n; ++t) {
            mpfr_sub(shifted.get(), prob[t].get(), maximum.get(), MPFR_RNDN);
            mpfr_exp(prob[t].get(), shifted.get(), MPFR_RNDN);
            mpfr_add(sum.get(), sum.get(), prob[t].get(), MPFR_RNDN);
          }
          for (std::size_t t = 0; t < n; ++t) mpfr_div(prob[t].get(), prob[t].get(), sum.get(), MPFR_RNDN);
          // D = rowsum(dO o O) with O = P V; dP = dO V^T.
          mpfr_set_zero(delta.get(), 1);
          for (std::int64_t c = 0; c < dv; ++c) {
            Big o, grad(dout.get(b, h, i, c));
            mpfr_set_zero(o.get(), 1);
            for (std::size_t t = 0; t < n; ++t) {
              Big vc(in.v.get(b, hk, keys[t], c));
              mpfr_mul(product.get(), prob[t].get(), vc.get(), MPFR_RNDN);
              mpfr_add(o.get(), o.get(), product.get(), MPFR_RNDN);
            }
            mpfr_mul(product.get(), grad.get(), o.get(), MPFR_RNDN);
            mpfr_add(delta.get(), delta.get(), product.get(), MPFR_RNDN);
          }
          for (std::size_t t = 0; t < n; ++t) {
            mpfr_set_zero(dprob[t].get(), 1);
            for (std::int64_t c = 0; c < dv; ++c) {
              Big grad(dout.get(b, h, i, c)), vc(in.v.get(b, hk, keys[t], c));
              mpfr_mul(product.get(), grad.get(), vc.get(), MPFR_RNDN);
              mpfr_add(dprob[t].get(), dprob[t].get(), product.get(), MPFR_RNDN);
            }
            // dS = P (dP - D), then scale dS for dQ and dK.
            mpfr_sub(difference.get(), dprob[t].get(), delta.get(), MPFR_RNDN);
            mpfr_mul(ds[t].get(), prob[t].get(), difference.get(), MPFR_RNDN);
            mpfr_mul(ds[t].get(), ds[t].get(), chain[t].get(), MPFR_RNDN);
            mpfr_mul(ds[t].get(), ds[t].get(), scale.get(), MPFR_RNDN);
          }
          // dQ_i = sum_j (scale dS_ij) K_j, rounded once.
          for (std::int64_t c = 0; c < d; ++c) {
            mpfr_set_zero(term.get(), 1);
            for (std::size_t t = 0; t < n; ++t) {
              Big kc(in.k.get(b, hk, keys[t], c));
              mpfr_mul(product.get(), ds[t].get(), kc.get(), MPFR_RNDN);
              mpfr_add(term.get(), term.get(), product.get(), MPFR_RNDN);
            }
            result.dq_row(b, h, i)[c] = term.to_double();
          }
          // dK_j += (scale dS_ij) Q_i; dV_j += P_ij dO_i.
          for (std::size_t t = 0; t < n; ++t) {
            const std::int64_t j = keys[t];
            for (std::int64_t c = 0; c < d; ++c) {
              Big qc(in.q.get(b, h, i, c));
              mpfr_mul(product.get(), ds[t].get(), qc.get(), MPFR_RNDN);
              mpfr_add(dk[j * d + c].get(), dk[j * d + c].get(), product.get(), MPFR_RNDN);
            }
            for (std::int64_t c = 0; c < dv; ++c) {
              Big grad(dout.get(b, h, i, c));
              mpfr_mul(product.get(), prob[t].get(), grad.get(), MPFR_RNDN);
              mpfr_add(dvalue[j * dv + c].get(), dvalue[j * dv + c].get(), product.get(), MPFR_RNDN);
            }
          }
        }
      for (std::int64_t j = 0; j < lk; ++j) {
        for (std::int64_t c = 0; c < d; ++c) result.dk_row(b, hk, j)[c] = dk[j * d + c].to_double();
        for (std::int64_t c = 0; c < dv; ++c) result.dv_row(b, hk, j)[c] = dvalue[j * dv + c].to_double();
      }
    }
  }
  return result;
}

#endif

}  // namespace flashcheck
