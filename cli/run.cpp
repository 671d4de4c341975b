#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flashcheck/cli/commands.hpp"
#include "flashcheck/cli/progress.hpp"
#include "flashcheck/cli/watchdog.hpp"
#include "flashcheck/core/record.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/values.hpp"
#include "flashcheck/judge/judge.hpp"
#include "flashcheck/core/backward.hpp"
#include "flashcheck/fuzz/sweep_parts.hpp"
#include "flashcheck/oracles/kokkos/kokkos_backward.hpp"
#include "flashcheck/oracles/kokkos/kokkos_reference.hpp"

namespace flashcheck::cli {
namespace {


void print_verdict(const CaseResult& r, std::int64_t rows_compared) {
  if (r.verdict_kind == VerdictKind::pass) fmt::print("  verdict: PASS -- {}\n", r.verdict.rule);
  else if (r.verdict_kind == VerdictKind::vacuous)
    fmt::print("  verdict: VACUOUS -- nothing compared: none of the {} compared row(s) sees a key (empty or fully "
               "masked), or no element was compared; held ({})\n",
               rows_compared, r.verdict.rule);
  else if (r.verdict_kind == VerdictKind::deviation)
    fmt::print("  verdict: DEVIATION -- outside the rule ({}), inside a limit the subject declares: {}\n",
               r.verdict.rule, r.deviation);
  else fmt::print("{}", explain(r));
}

// A backward case: the rule's checks on dQ, dK and dV, each gradient's error
// distribution beside the baseline's, and the NaN/Inf census.
void print_backward_case(const CaseResult& r) {
  fmt::print("rows checked: dQ on {} of {} query rows, dK/dV on {} of {} key rows{}   time: subject {:.1f} ms, oracle "
             "{:.1f} ms, baseline {:.1f} ms\n",
             r.rows.size(), r.problem.seqlen_q, r.kv_rows.size(), r.problem.seqlen_kv,
             r.on_every_row() ? "" : " (sampled)", r.subject_ms, r.oracle_ms, r.baseline_ms);
  if (!r.every_row_unavailable.empty())
    fmt::print("  every row: not checked ({})\n", r.every_row_unavailable);
  fmt::print("  {:<16} {:>11} {:>11} {:>11} {:>7}\n", "vs cpu_f64", "subject",
             fmt::format("cpu_lowp/{}", to_string(r.baseline_dtype)), "bound", "ratio");
  for (const auto& c : r.verdict.checks)
    fmt::print("  {:<16} {:>11.3e} {:>11.3e} {:>11.3e} {:>7.2f}{}\n", c.metric, c.subject, c.baseline, c.bound, c.ratio,
               c.pass ? "" : "  FAIL");
  const std::tuple<const char*, const TensorMetrics*, const TensorMetrics*> gradients[] = {
      {"dq", &r.subject_gradients.dq, &r.baseline_gradients.dq},
      {"dk", &r.subject_gradients.dk, &r.baseline_gradients.dk},
      {"dv", &r.subject_gradients.dv, &r.baseline_gradients.dv}};
  for (const auto& [name, s, b] : gradients) {
    fmt::print("  {:<16} {:>11.3e} {:>11.3e}\n", fmt::format("{}.p99", name), s->errors.p99, b->errors.p99);
    fmt::print("  {:<16} {:>11.3e} {:>11.3e}\n", fmt::format("{}.normwise_rel", name), s->errors.normwise_rel,
               b->errors.normwise_rel);
    fmt::print("  {:<16} {:>11.2f} {:>11.2f}   (|t| > 4: a systematic bias; recorded, not judged)\n",
               fmt::format("{}.bias_t", name), s->errors.bias_t, b->errors.bias_t);
  }
  const std::int64_t differ =
      r.subject_gradients.dq.census.mismatches + r.subject_gradients.dk.census.mismatches + r.subject_gradients.dv.census.mismatches;
  fmt::print("  NaN/Inf census: {}\n", differ == 0 ? "agrees" : fmt::format("{} position(s) differ", differ));
  if (r.reruns > 0)
    fmt::print("  reruns: {} more backward run(s), {}\n", r.reruns,
               r.rerun_spread == 0 ? std::string("each bitwise the first")
                                   : fmt::format("largest difference from the first {:.3e}", r.rerun_spread));
  if (r.peer && r.peer->gradients)
    fmt::print("  vs {} (same inputs): err(subject)/err({}) = {:.2f} (max), {:.2f} (rmse), worst of dQ, dK, dV; {}\n",
               r.peer->name, r.peer->name, r.peer->gradient_max_ratio, r.peer->gradient_rmse_ratio, r.peer->version);
  if (!r.subject_version.empty()) fmt::print("  subject: {}\n", r.subject_version);
  print_verdict(r, r.subject_gradients.q_rows_compared);
}

void print_case(const CaseResult& r) {
  if (r.backward()) return print_backward_case(r);
  const auto& s = r.subject_metrics;
  const auto& base = r.baseline_metrics;
  fmt::print("rows checked: {} of {} per (batch, head){}   time: subject {:.1f} ms, oracle {:.1f} ms, baseline {:.1f} ms\n",
             r.rows.size(), r.problem.seqlen_q, r.rows.size() < r.problem.seqlen_q ? " (sampled)" : "", r.subject_ms,
             r.oracle_ms, r.baseline_ms);
  if (!r.every_row_unavailable.empty())
    fmt::print("  every row: not checked ({}); the verdict rests on the sampled rows\n", r.every_row_unavailable);
  fmt::print("  {:<16} {:>11} {:>11} {:>11} {:>7}\n", "vs cpu_f64", "subject",
             fmt::format("cpu_lowp/{}", to_string(r.baseline_dtype)), "bound", "ratio");
  for (const auto& c : r.verdict.checks)
    fmt::print("  {:<16} {:>11.3e} {:>11.3e} {:>11.3e} {:>7.2f}{}\n", c.metric, c.subject, c.baseline, c.bound, c.ratio,
               c.pass ? "" : "  FAIL");
  const auto& e = s.o.errors;
  const auto& be = base.o.errors;
  fmt::print("  {:<16} {:>11.3e} {:>11.3e}\n", "o.p50", e.p50, be.p50);
  fmt::print("  {:<16} {:>11.3e} {:>11.3e}\n", "o.p99", e.p99, be.p99);
  fmt::print("  {:<16} {:>11.3e} {:>11.3e}\n", "o.p99.9", e.p999, be.p999);
  fmt::print("  {:<16} {:>11.3e} {:>11.3e}\n", "o.normwise_rel", e.normwise_rel, be.normwise_rel);
  fmt::print("  {:<16} {:>11.2f} {:>11.2f}\n", "o.p99_ulp", e.p99_ulp, be.p99_ulp);
  fmt::print("  {:<16} {:>11.2f} {:>11.2f}   (inf: a sign flip of a value near 0)\n", "o.max_ulp", e.max_ulp, be.max_ulp);
  fmt::print("  {:<16} {:>11.2f} {:>11.2f}   (|t| > 4: a systematic bias)\n", "o.bias_t", e.bias_t, be.bias_t);
  fmt::print("  {:<16} {:>11.2f} {:>11.2f}   (< -4: outputs shrink toward 0; recorded, not judged)\n", "o.magnitude_t", e.magnitude_t,
             be.magnitude_t);
  const auto& census = s.o.census;
  fmt::print("  NaN/Inf census: {} (subject {} NaN, {} Inf; oracle {} NaN, {} Inf){}\n",
             census.mismatches == 0 ? "agrees" : fmt::format("{} position(s) differ", census.mismatches), census.got_nan,
             census.got_pos_inf + census.got_neg_inf, census.want_nan, census.want_pos_inf + census.want_neg_inf,
             s.has_lse && s.lse.census.mismatches ? fmt::format("; LSE: {} differ", s.lse.census.mismatches) : "");
  if (r.peer)
    fmt::print("  vs {} (same inputs): err(subject)/err({}) = {:.2f} (max), {:.2f} (rmse); {}\n", r.peer->name,
               r.peer->name, r.peer->o_max_ratio, r.peer->o_rmse_ratio, r.peer->version);
  if (!r.subject_version.empty()) fmt::print("  subject: {}\n", r.subject_version);
  print_verdict(r, r.subject_metrics.rows_compared);
}

/// Cross-oracle triangulation of one case: the subject against cpu_f64 and
/// against the Kokkos reference (an independent online-softmax code), and the
/// two references against each other, on the rows the case checked (core's
/// compare: padding skipped; non-finite disagreements counted by its census).
/// `kokkos` is the reference on those rows, computed once per problem.
void print_triangulation(const CaseResult& r, const AttentionRows& kokkos) {
  const AttentionRows subject = gather_rows(r.problem, r.outputs, r.rows);
  const DType dtype = output_dtype(r.problem.dtype);
  const auto line = [](std::string_view pair, const CaseMetrics& m) {
    const std::int64_t census = m.o.census.mismatches + (m.has_lse ? m.lse.census.mismatches : 0);
    fmt::print("    {:<22} {:.3e} ({:.3e}){}\n", pair, m.o.errors.max_abs, m.has_lse ? m.lse.errors.max_abs : 0.0,
               census ? fmt::format("; {} NaN/Inf position(s) differ", census) : "");
  };
  fmt::print("  triangulation ({}), max |difference| over O (LSE):\n", kokkos_description());
  line("cpu_f64 vs kokkos_f64", compare(r.problem, r.reference, kokkos, dtype));
  const CaseMetrics vs_f64 = compare(r.problem, subject, r.reference, dtype);
  line("subject vs cpu_f64", vs_f64);
  line("subject vs kokkos_f64", compare(r.problem, subject, kokkos, dtype));
  if (const auto& worst = vs_f64.o.errors.worst; worst && worst->abs_error > 0) {
    const auto& rows = r.rows.rows;
    const auto index = std::lower_bound(rows.begin(), rows.end(), worst->at.row) - rows.begin();
    fmt::print("    worst O element (b={} h={} row={} col={}): subject {:.9g}, cpu_f64 {:.9g}, kokkos_f64 {:.9g}\n",
               worst->at.b, worst->at.h, worst->at.row, worst->at.column, worst->got, worst->want,
               kokkos.o_row(worst->at.b, worst->at.h, index)[worst->at.column]);
  }
}

/// The backward's triangulation: the subject's gradients against cpu_f64's
/// and Kokkos' (Algorithm 2 in f64, an independent code), and the two
/// references against each other, on the query rows (dQ) and key rows (dK,
/// dV) the case checked. `kokkos` is the gradient reference on those rows.
void print_gradient_triangulation(const CaseResult& r, const GradientRows& kokkos) {
  const GradientRows subject = gather_gradients(r.problem, r.gradients, r.rows, r.kv_rows);
  const DType dtype = r.problem.dtype;
  const auto line = [](std::string_view pair, const GradientMetrics& m) {
    const std::int64_t census = m.dq.census.mismatches + m.dk.census.mismatches + m.dv.census.mismatches;
    fmt::print("    {:<22} {:.3e} {:.3e} {:.3e}{}\n", pair, m.dq.errors.max_abs, m.dk.errors.max_abs, m.dv.errors.max_abs,
               census ? fmt::format("; {} NaN/Inf position(s) differ", census) : "");
  };
  fmt::print("  triangulation ({}), max |difference| over dQ dK dV:\n", kokkos_description());
  line("cpu_f64 vs kokkos_f64", compare_gradients(r.problem, r.gradient_reference, kokkos, dtype));
  line("subject vs cpu_f64", compare_gradients(r.problem, subject, r.gradient_reference, dtype));
  line("subject vs kokkos_f64", compare_gradients(r.problem, subject, kokkos, dtype));
}

}  // namespace

int run_cases(const RunOptions& options) {
  const auto problems = read_problems(options.problem_lines, options.problems_file);
  bool every_subject = false;
  const std::vector<Subject*> subjects = resolve_subjects(options.subjects, &every_subject);
  std::unique_ptr<RecordWriter> records;
  if (!options.record_path.empty()) {
    try {
      records = std::make_unique<RecordWriter>(options.record_path);
    } catch (const std::runtime_error& error) {  // the path given cannot be opened: bad input
      throw std::invalid_argument(fmt::format("--record: {}", error.what()));
    }
  }

  JudgeOptions judge_options;
  judge_options.max_rows = options.max_rows;
  judge_options.peers = resolve_peers(options.peers, options.no_peer);
  judge_options.keep_outputs = options.kokkos;
  judge_options.every_row = judge_every_row_option(options.every_row);
  if (options.kokkos && !kokkos_available())
    throw std::invalid_argument("--kokkos: this build has no Kokkos reference (install libtrilinos-kokkos-dev, reconfigure)");
  if (options.require_gpu)
    if (const int code = check_required_gpu(subjects); code != kExitPass) return code;
  if (const int code = check_every_row(options.every_row); code != kExitPass) return code;
  int passed = 0, failed = 0, unsupported = 0, unavailable = 0, vacuous = 0, deviations = 0;
  int on_sampled_rows = 0;  // cases that ran whose verdict rests on sampled rows
  std::set<std::string_view> reported_unavailable;  // one UNAVAILABLE line per subject
  const bool single = problems.size() * subjects.size() == 1;
  // With more than one case, "case i/n" on stderr while each runs (a terminal only).
  Progress progress(!single);
  const std::size_t total_cases = problems.size() * subjects.size();
  std::size_t case_index = 0;
  CaseWatchdog watchdog;
  for (const Problem& problem : problems) {
    // With --kokkos: the inputs once per problem, and the Kokkos reference once
    // per set of checked rows (the same for every subject at the same --rows).
    std::optional<Inputs> inputs;
    if (options.kokkos) inputs = generate_inputs(problem);
    std::optional<AttentionRows> kokkos;
    std::optional<GradientRows> kokkos_gradient_rows;
    for (Subject* subject : subjects) {
      progress.show("case", case_index++, total_cases, fmt::format("{} {}", subject->name(), to_line(problem)));
      // A hang ends the run: recorded as a timeout (as fuzz records its worker's), exit 1.
      watchdog.arm(fuzz::detail::watchdog_for(problem, options.watchdog_seconds),
                   fmt::format("{} on '{}'", subject->name(), to_line(problem)), [&] {
                     if (!records) return;
                     CaseRecord lost;
                     lost.verdict = CaseVerdict::timeout;
                     lost.check = "timeout";
                     lost.subject = subject->name();
                     lost.problem = to_line(problem);
                     lost.reproducer = replay_command(subject->name(), problem);
                     lost.message = "no answer within the --watchdog deadline";
                     records->write(lost);
                   });
      const CaseResult result =
          inputs ? judge(*subject, problem, *inputs, judge_options) : judge(*subject, problem, judge_options);
      watchdog.disarm();
      progress.clear();
      if (records) records->write(to_record(result));
      if (result.status == Status::unsupported) {
        ++unsupported;
        if (single || !every_subject)
          fmt::print(stderr, "unsupported: {} does not support this problem: {}\n", subject->name(), result.message);
        continue;
      }
      if (result.status == Status::unavailable) {
        if (options.require_gpu) {  // the device went away after the check: still one line, and a failure
          fmt::print(stderr, "flashcheck: --require-gpu: {} is unavailable here: {}\n", subject->name(), result.message);
          ++failed;
          continue;
        }
        ++unavailable;
        if (reported_unavailable.insert(subject->name()).second)
          fmt::print("UNAVAILABLE  {:<12} not run on this machine: {}\n", subject->name(), result.message);
        continue;
      }
      if (options.every_row == EveryRowMode::on && !result.every_row_unavailable.empty() && result.verdict.pass) {
        // the device went away after the check: one line, and a failure
        fmt::print(stderr, "flashcheck: --every-row on: {} on '{}': {}\n", subject->name(), to_line(problem),
                   result.every_row_unavailable);
        ++failed;
        continue;
      }
      // -q: one line for a pass, a vacuous case and a deviation; the whole case for a failure.
      const std::string_view brief = result.passed()                            ? "PASS"
                                     : result.verdict_kind == VerdictKind::vacuous &&
                                               result.ran()                   ? "VACUOUS"
                                     : result.verdict_kind == VerdictKind::deviation &&
                                               result.ran()                   ? "DEVIATION"
                                                                              : "";
      if (!options.quiet || brief.empty()) {
        fmt::print("\n== {}  {}\n", subject->name(), to_line(problem));
        if (result.ran()) {
          print_case(result);
          if (options.kokkos && problem.seqlen_q > options.max_rows && result.on_every_row()) {
            // Judged on every row: the reference already is kokkos_f64 (on the GPU), and cpu_f64 agreed on the sample.
            fmt::print("  triangulation: the verdict's reference is kokkos_f64 on every row; cpu_f64 agreed with it on "
                       "the sampled rows (1e-12)\n");
          } else if (options.kokkos && problem.pass == Pass::bwd) {
            if (!kokkos_gradient_rows || kokkos_gradient_rows->q_rows != result.rows ||
                kokkos_gradient_rows->kv_rows != result.kv_rows)
              kokkos_gradient_rows =
                  kokkos_gradients(problem, *inputs, generate_dout(problem), result.rows, result.kv_rows);
            print_gradient_triangulation(result, *kokkos_gradient_rows);
          } else if (options.kokkos) {
            if (!kokkos || kokkos->rows != result.rows)
              kokkos = kokkos_reference(problem, *inputs, result.rows, Accumulation::f64);
            print_triangulation(result, *kokkos);
          }
        } else {
          fmt::print("  verdict: FAIL -- subject returned {}\n{}", to_string(result.status), explain(result));
        }
      } else {
        fmt::print("{:<9} {:<12} {}\n", brief, subject->name(), to_line(problem));
      }
      if (result.ran() && !result.on_every_row()) ++on_sampled_rows;
      if (result.passed()) ++passed;
      else if (result.ran() && result.verdict_kind == VerdictKind::vacuous) ++vacuous;
      else if (result.ran() && result.verdict_kind == VerdictKind::deviation) ++deviations;
      else ++failed;
    }
  }
  if (!single)
    fmt::print("\nsummary: {} case(s): {} pass, {} fail, {} vacuous (nothing compared), {} deviation (a declared "
               "limit), {} unsupported (skipped), {} unavailable (not run here){}{}\n",
               passed + failed + vacuous + deviations + unsupported + unavailable, passed, failed, vacuous, deviations,
               unsupported, unavailable,
               on_sampled_rows ? fmt::format("; {} verdict(s) rest on sampled rows", on_sampled_rows) : "",
               records ? fmt::format("; records appended to {}", records->path()) : "");
  print_subject_stats();
  // Vacuous cases and declared deviations are not failures (exit 0), but they are never counted as passes.
  if (failed > 0) return kExitFail;
  if (unsupported > 0 && !every_subject) return kExitBadInput;
  if (passed + vacuous + deviations == 0) {
    fmt::print(stderr, "flashcheck: no case ran: every subject/problem pair was {}\n",
               unavailable == 0 ? "unsupported"
               : unsupported == 0 ? "unavailable on this machine"
                                  : "unsupported or unavailable on this machine");
    return kExitBadInput;
  }
  return kExitPass;
}

void add_run(CLI::App& app, int& exit_code) {
  auto options = std::make_shared<RunOptions>();
  auto* command = app.add_subcommand("run", "Run problems on subjects and judge them against the f64 oracle");
  add_subjects(*command, options->subjects)->required();
  command->add_option("-p,--problem", options->problem_lines, "A problem line (repeatable; README: problem lines)");
  command->add_option("--problems", options->problems_file,
                      "A file of problem lines ('#' starts a comment), read after the --problem lines");
  command->add_option("--record", options->record_path,
                      "Append one JSON record per case to this JSON Lines file (default: no records)");
  command->add_option("--rows", options->max_rows, "Check every row up to this seqlen_q, else sample this many rows")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40))
      ->capture_default_str();
  command->add_flag("-q,--quiet", options->quiet, "One line per passing case (a failure is printed whole)");
  add_peer(*command, options->peers, options->no_peer);
  command->add_flag("--kokkos", options->kokkos,
                    "Also triangulate: the subject against the Kokkos reference, and cpu_f64 against it, on the\n"
                    "checked rows (to tell a subject's bug from an oracle's)");
  add_require_gpu(*command, options->require_gpu);
  command->add_option("--watchdog", options->watchdog_seconds,
                      "Seconds per case before flashcheck gives it up as a hang, records it as a timeout and exits 1\n"
                      "(0: scaled to the case's size, as fuzz's: 60 s + 1 s per 1e7 multiply-adds)")
      ->check(finite_in(0, kMaxSeconds))
      ->capture_default_str();
  add_max_memory(*command);
  add_every_row(*command, options->every_row);
  command->footer(fmt::format("Example: flashcheck run -s cpu-plain,smoke-cpu-lowp --problems cli/smoke.problems -q\n{}",
                              kRunExitCodes));
  command->callback([options, &exit_code] { exit_code = run_cases(*options); });
}

}  // namespace flashcheck::cli
