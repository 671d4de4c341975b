// Mutants of cpu-plain (kernels/cpu/plain.hpp): the same kernel with one
// deliberate flaw each, registered only in test builds. The property suite must
// catch every one within its default budget (properties/subject_suite.cpp,
// tests Mutants.*), while passing cpu-plain itself, the control.
#include "flashcheck/kernels/cpu/plain.hpp"

namespace flashcheck {
namespace {

struct PlainMutant {
  PlainFlaw flaw;
  std::string_view name;
  std::string_view what;
};

constexpr PlainMutant kPlainMutants[] = {
    {PlainFlaw::no_max_subtraction, "mutant-cpu-no-max-subtraction", "cpu-plain without subtracting the row maximum"},
    {PlainFlaw::bottom_right_as_top_left, "mutant-cpu-br-as-tl", "cpu-plain with causal_br computed as causal_tl"},
    {PlainFlaw::causal_off_by_one, "mutant-cpu-causal-off-by-one", "cpu-plain whose causal rows see one key too many"},
    {PlainFlaw::scale_squared, "mutant-cpu-scale-squared", "cpu-plain with the softmax scale applied twice"},
    {PlainFlaw::lse_in_log2, "mutant-cpu-lse-log2", "cpu-plain writing LSE in log2"},
    {PlainFlaw::window_off_by_one, "mutant-cpu-window-off-by-one", "cpu-plain whose window is one key wider on the left"},
    {PlainFlaw::scale_hardcoded_d64, "mutant-cpu-scale-hardcoded-d64",
     "cpu-plain scaling logits by 1/sqrt(64) at d = 64, ignoring Problem::softmax_scale"},
    {PlainFlaw::bf16_truncating_epilogue, "mutant-cpu-bf16-truncating-epilogue",
     "cpu-plain rounding its bf16 output toward zero instead of to nearest"},
    // Backward-only flaws (issue 22's bug classes): the forward stays correct,
    // so only pass=bwd properties (Backward*) can catch them.
    {PlainFlaw::bwd_scale_missing_in_ds, "mutant-cpu-bwd-scale-missing-in-ds",
     "cpu-plain's backward without the softmax scale in dS (dQ and dK off by 1/scale)"},
    {PlainFlaw::bwd_gqa_not_reduced, "mutant-cpu-bwd-gqa-not-reduced",
     "cpu-plain's backward taking dK and dV from the first query head of each GQA group only"},
    {PlainFlaw::bwd_masked_keys_in_dk, "mutant-cpu-bwd-masked-keys-in-dk",
     "cpu-plain's backward adding masked keys' dS into dK"},
    {PlainFlaw::bwd_delta_low_precision, "mutant-cpu-bwd-delta-low-precision",
     "cpu-plain's backward accumulating D_i = rowsum(dO o O) in the storage dtype instead of f32"},
    {PlainFlaw::bwd_d256_only_wrong, "mutant-cpu-bwd-d256-only-wrong",
     "cpu-plain's backward leaving the last column of dQ at 0 when d = 256"},
    {PlainFlaw::bwd_p_flushed, "mutant-cpu-bwd-p-flushed",
     "cpu-plain's backward flushing a subnormal P to 0 (ex2.approx.ftz's flaw, which a GPU sweep found in the "
     "mma.sync and Hopper backward kernels, 2026-11-28)"},
    // Score-modification flaws (issue 25): only problems with softcap= or
    // alibi=yes can catch them.
    {PlainFlaw::softcap_before_scale, "mutant-cpu-softcap-before-scale",
     "cpu-plain capping the unscaled logit, C tanh(q.k / C), and scaling it afterwards"},
    {PlainFlaw::alibi_top_left, "mutant-cpu-alibi-top-left",
     "cpu-plain with ALiBi's bias top-left aligned, -slope |i - j|, where the convention is bottom-right"},
    {PlainFlaw::page_table_ignored, "mutant-cpu-page-table-ignored",
     "cpu-plain reading a paged K/V pool as if its pages were in sequence order (the page table ignored)"},
    {PlainFlaw::page_off_by_one, "mutant-cpu-page-off-by-one",
     "cpu-plain reading the first key of each page from the previous table entry's page"},
    // fp8 (issue 25): only dtype=e4m3/e5m2 problems can catch it.
    {PlainFlaw::fp8_k_descale_missing, "mutant-cpu-fp8-descale-missing",
     "cpu-plain using K's stored fp8 values without K's descale factor"},
};

struct Registrations {
  Registrations() {
    for (const PlainMutant& mutant : kPlainMutants)
      MutantRegistration([&mutant] { return std::make_unique<CpuPlain>(mutant.name, mutant.what, mutant.flaw); });
  }
} registrations;

}  // namespace
}  // namespace flashcheck
