#include "oracles/judge.hpp"

#include <fmt/format.h>

#include <chrono>

#include "core/record.hpp"
#include "core/values.hpp"
#include "oracles/cpu_f64.hpp"
#include "oracles/cpu_lowp.hpp"

namespace flashcheck {
namespace {

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

std::string CaseResult::reproducer() const {
  return fmt::format("flashcheck run --subject {} --problem '{}'", subject, to_line(problem));
}

CaseResult judge(Subject& subject, const Problem& problem, const JudgeOptions& options) {
  validate(problem);
  CaseResult result;
  result.problem = problem;
  result.subject = std::string(subject.name());
  const Capabilities& caps = subject.capabilities();
  result.baseline_dtype = caps.compute_dtype.value_or(problem.dtype);
  if (auto reason = unsupported_reason(caps, problem)) {
    result.status = Status::unsupported;
    result.message = *reason;
    return result;
  }

  auto start = std::chrono::steady_clock::now();
  const Inputs inputs = generate_inputs(problem);
  result.inputs_ms = elapsed_ms(start);

  start = std::chrono::steady_clock::now();
  RunResult run = subject.run(problem, inputs);
  result.subject_ms = elapsed_ms(start);
  result.status = run.status;
  result.message = run.message;
  if (run.status != Status::ok) return result;

  result.rows = problem.seqlen_q <= options.max_rows ? all_rows(problem)
                                                     : sample_rows(problem, options.max_rows, options.row_seed);
  start = std::chrono::steady_clock::now();
  const AttentionRows reference = cpu_f64_reference(problem, inputs, result.rows);
  result.oracle_ms = elapsed_ms(start);

  start = std::chrono::steady_clock::now();
  const AttentionRows baseline = cpu_lowp_rows(problem, inputs, result.rows, result.baseline_dtype);
  result.baseline_ms = elapsed_ms(start);

  result.baseline_metrics = compare(problem, baseline, reference, problem.dtype);
  const Bounds bounds = rule_bounds(result.baseline_metrics, problem.dtype);
  const AttentionRows got = gather_rows(problem, run.outputs, result.rows);
  result.subject_metrics = compare(problem, got, reference, problem.dtype, bounds);
  result.verdict = decide(result.subject_metrics, result.baseline_metrics, problem.dtype);
  return result;
}

nlohmann::json to_record(const CaseResult& r) {
  nlohmann::json record = {
      {"schema", kRecordSchema},
      {"subject", r.subject},
      {"problem", to_line(r.problem)},
      {"geometry_seed", r.problem.geometry_seed},
      {"data_seed", r.problem.data_seed},
      {"dtype", std::string(to_string(r.problem.dtype))},
      {"status", std::string(to_string(r.status))},
      {"reproducer", r.reproducer()},
      {"timing_ms", {{"inputs", r.inputs_ms}, {"subject", r.subject_ms}, {"oracle", r.oracle_ms}, {"baseline", r.baseline_ms}}},
  };
  record["time"] = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (!r.message.empty()) record["message"] = r.message;
  if (!r.ran()) {
    record["verdict"] = to_string(r.status);
    return record;
  }
  record["verdict"] = r.verdict.pass ? "pass" : "fail";
  record["rule"] = r.verdict.rule;
  record["rows_checked"] = r.rows.size();
  record["baseline"] = {{"name", "cpu_lowp"}, {"dtype", std::string(to_string(r.baseline_dtype))},
                        {"metrics", to_json(r.baseline_metrics)}};
  record["metrics"] = to_json(r.subject_metrics);
  record["tolerance"] = to_json(r.verdict);
  return record;
}

}  // namespace flashcheck
