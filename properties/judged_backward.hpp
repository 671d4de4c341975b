// One backward case through the judge (judge_backward), on every query and
// key row and without reruns, in the shape the backward tests read it: the
// subject's call (its status, gradients and own time), the rule's verdict,
// and the subject's and the baseline's gradient metrics.
#pragma once

#include <algorithm>
#include <utility>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/judge/judge.hpp"

namespace flashcheck::testing_backward {

struct Judged {
  BackwardResult run;
  Verdict verdict;
  GradientMetrics subject, baseline;
};

/// `in` holds the inputs and dO; the judge hands the subject the O and LSE
/// that backward_outputs makes of them (what `in.forward` holds when it was
/// made so).
inline Judged judge_every_row(Subject& subject, const Problem& p, const BackwardInputs& in) {
  JudgeOptions options;
  options.max_rows = std::max<std::int64_t>({1, p.seqlen_q, p.seqlen_kv});
  options.backward_reruns = 0;
  options.keep_outputs = true;
  CaseResult r = judge_backward(subject, p, in.inputs, in.dout, options);
  Judged j;
  j.run = BackwardResult{r.status, r.message, std::move(r.gradients), r.subject_reported_ms};
  j.verdict = r.verdict;
  j.subject = r.subject_gradients;
  j.baseline = r.baseline_gradients;
  return j;
}

}  // namespace flashcheck::testing_backward
