// The judge: runs one case end to end. It draws the inputs, runs the subject,
// computes the f64 oracle and the same-precision baseline on the same rows,
// measures both against the oracle and applies the tolerance rule.
#pragma once

#include <limits>

#include <optional>
#include <string>

#include "flashcheck/core/backward.hpp"
#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/record.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/tolerance.hpp"

namespace flashcheck {

/// Whether the judge checks a case it sampled again on every query row, with
/// the Kokkos reference and baseline (oracles/kokkos/every_row.hpp).
enum class EveryRow : std::uint8_t {
  off,     // the verdict rests on the sampled rows
  device,  // on the GPU, where a CUDA Kokkos is built in and a GPU is present; elsewhere the
           // sampled verdict stays and CaseResult::every_row_unavailable says why
  host,    // on the host's Kokkos (Serial): the same code, slowly; for tests
};
std::string_view to_string(EveryRow every_row);

/// Where the judge takes a case's f64 oracle (with its conditions) and its
/// same-precision baseline from, when the caller keeps them (the properties'
/// Testbed caches them per problem and inputs).
class ReferenceSource {
 public:
  virtual ~ReferenceSource() = default;
  virtual AttentionRows reference(const Problem& problem, const Inputs& inputs, const RowSet& rows) = 0;
  virtual AttentionRows baseline(const Problem& problem, const Inputs& inputs, const RowSet& rows, DType working) = 0;
};

struct JudgeOptions {
  /// Query rows checked per (batch, head): every row when seqlen_q is at most
  /// this, otherwise a sample of this size (first/last rows and tile edges always in).
  std::int64_t max_rows = 1024;
  std::uint64_t row_seed = 0;
  /// Keep the subject's outputs in the result (for metamorphic comparisons).
  bool keep_outputs = false;
  /// The peer baseline (the CLI gives cuDNN unless --peer names another, or
  /// --no-peer none): for half-precision problems it runs on the same inputs
  /// and the case reports err(subject) / err(peer). Not owned; null for none.
  /// On each problem the first whose domain holds it (peer_for). Empty for none.
  std::vector<Subject*> peers;
  /// Where max_rows sampled the rows: judge the case again on every row.
  EveryRow every_row = EveryRow::off;
  /// The oracle and the baseline from here instead of computed. Not owned; null for none.
  ReferenceSource* references = nullptr;
  /// pass=bwd: the backward runs this many more times on the same inputs. A
  /// subject that declares Capabilities::backward_deterministic fails unless
  /// every rerun is bitwise the first run; any other has each rerun judged by
  /// the rule too, and the spread of its reruns recorded.
  int backward_reruns = 1;
  /// How much of the forward's error statistics compare() computes
  /// (MetricDepth): `rule` leaves out the percentiles, histograms and ULPs,
  /// which only records and reports show. The verdict is the same.
  MetricDepth metric_depth = MetricDepth::full;
};

/// The peer baseline's errors on the same case, against the same oracle.
struct PeerResult {
  std::string name, version;
  CaseMetrics metrics;
  double o_max_ratio = 0, o_rmse_ratio = 0;  // err(subject) / err(peer)
  // pass=bwd: the peer's gradients, and the largest ratio over dQ, dK and dV.
  std::optional<GradientMetrics> gradients;
  double gradient_max_ratio = 0, gradient_rmse_ratio = 0;
};

/// The verdict of a case that ran (CaseResult::status ok).
enum class VerdictKind : std::uint8_t {
  pass,       // something was compared, and it held
  fail,       // outside the tolerance rule
  vacuous,    // held, but nothing was compared: no compared row sees a key, or no element of O (finite or not)
  deviation,  // outside the rule, inside a limit the subject declares (CaseResult::deviation says which)
};
std::string_view to_string(VerdictKind kind);

/// Everything one case produced.
struct CaseResult {
  Problem problem;
  std::string subject;
  std::string subject_version;      // libraries behind the subject (cuDNN and frontend versions)
  Status status = Status::ok;
  std::string message;              // why it was unsupported or failed to run
  DType baseline_dtype = DType::f32;
  bool baseline_o_fp8 = false;      // the baseline's O rounded to the fp8 inputs' format (Capabilities::fp8_output)
  RowSet rows;
  CaseMetrics subject_metrics;      // subject vs cpu_f64
  CaseMetrics baseline_metrics;     // cpu_lowp vs cpu_f64
  Verdict verdict;                  // the tolerance rule's checks
  VerdictKind verdict_kind = VerdictKind::pass;  // the verdict: the rule's, made vacuous or a deviation where it applies
  std::int64_t rows_visible = 0;    // compared rows (over heads) that see at least one key
  std::string deviation;            // with VerdictKind::deviation: the declared limit the case reaches
  LogitCondition condition;         // the floor's logit conditioning, from cpu_f64
  std::optional<PeerResult> peer;   // with JudgeOptions::peer, when the peer ran
  std::string every_row_unavailable;  // JudgeOptions::every_row asked, the rows were sampled, it cannot run here: why
  double inputs_ms = 0, subject_ms = 0, oracle_ms = 0, baseline_ms = 0;
  double subject_reported_ms = std::numeric_limits<double>::quiet_NaN();  // the subject's own time (RunResult::time_ms)
  Outputs outputs;                  // with JudgeOptions::keep_outputs
  AttentionRows reference;          // with JudgeOptions::keep_outputs
  // pass=bwd: dQ is compared on `rows`, dK and dV on `kv_rows`, with the rule
  // of decide_gradients (subject_metrics, baseline_metrics and condition stay
  // empty).
  RowSet kv_rows;
  GradientMetrics subject_gradients, baseline_gradients;
  GradientCondition gradient_condition;
  /// pass=bwd with reruns: the largest |difference| between a rerun's and the
  /// first run's gradients (0 for bitwise repeatable), over dQ, dK and dV.
  double rerun_spread = 0;
  int reruns = 0;
  Gradients gradients;              // pass=bwd with JudgeOptions::keep_outputs
  GradientRows gradient_reference;  // pass=bwd with JudgeOptions::keep_outputs

  bool ran() const { return status == Status::ok; }
  bool backward() const { return problem.pass == Pass::bwd; }
  /// Whether the verdict rests on every query row (the sample was every row,
  /// or the every-row judgement ran) rather than on sampled rows; for pass=bwd
  /// also on every key row.
  bool on_every_row() const {
    return rows.size() == problem.seqlen_q && (!backward() || kv_rows.size() == problem.seqlen_kv);
  }
  /// Ran and passed with something compared (vacuous and deviation are not passes).
  bool passed() const { return ran() && verdict_kind == VerdictKind::pass; }
  /// Ran and failed the rule with no declared limit to explain it.
  bool failed() const { return ran() && verdict_kind == VerdictKind::fail; }
  /// The command that replays this case (replay_command of its subject and problem).
  std::string reproducer() const;
};

/// The logit conditioning of a reference computed with its conditions, over
/// the valid rows and finite values.
LogitCondition logit_condition(const Problem& problem, const AttentionRows& reference);

/// Sets the accumulation scales of `condition` (tolerance.hpp): the keys the
/// longest of the compared rows sees, and max |V| over the finite values.
void add_accumulation(LogitCondition& condition, const Problem& problem, const RowSet& rows, const HostTensor& v);

/// The command line that replays one case of `subject` on `problem`.
std::string replay_command(std::string_view subject, const Problem& problem);

/// Judges one case. Throws BadInput for an invalid problem.
CaseResult judge(Subject& subject, const Problem& problem, const JudgeOptions& options = {});
/// Judges one case on given inputs (transformed inputs for metamorphic checks);
/// a pass=bwd problem draws its dO (generate_dout).
CaseResult judge(Subject& subject, const Problem& problem, const Inputs& inputs, const JudgeOptions& options = {});
/// Judges one backward case (Problem::pass = bwd) on given inputs and dO:
/// hands the subject the oracle's O and LSE (backward_outputs), runs its
/// backward, and compares dQ on sampled query rows and dK, dV on sampled key
/// rows (max_rows of each, every row when there are at most that many) with
/// cpu_f64's gradients, under decide_gradients with cpu_lowp's gradients as
/// the baseline. Throws BadInput for an invalid problem or a forward one.
CaseResult judge_backward(Subject& subject, const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                          const JudgeOptions& options = {});

/// What a backward subject is handed for a case (core/backward.hpp): Q, K,
/// V, dO and the f64 oracle's forward on every row, rounded (backward_outputs).
/// `exact_forward`, where given, receives that forward unrounded.
BackwardInputs hand_over(const Problem& problem, const Inputs& inputs, const HostTensor& dout,
                         AttentionRows* exact_forward = nullptr);

/// A failed case explained: the problem line, the rule that decided, the
/// first element over the bound, the worst element, the share over the bound,
/// and the replay command. Several lines.
std::string explain(const CaseResult& result);

/// The case's record (written with RecordWriter or dump_record, core/record.hpp).
CaseRecord to_record(const CaseResult& result);

}  // namespace flashcheck
