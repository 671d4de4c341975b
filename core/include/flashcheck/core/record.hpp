// Records: one JSON object per case (or per bench timing), appended to a JSON
// Lines file and flushed per case, so that a killed run loses at most the case
// in flight. One typed `Record` is written by one writer (to_json, dump_record,
// RecordWriter) and read by one reader (read_record, parse_record); docs/record.schema.json
// is the contract with reports/report.py.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "flashcheck/core/dtype.hpp"
#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/subject.hpp"
#include "flashcheck/core/tolerance.hpp"

namespace flashcheck {

/// Version of the record format. The writer always writes this one; the reader
/// reads kOldestReadableRecordSchema up to it and refuses others.
/// 2: the verdicts `vacuous` (nothing compared) and `deviation` (a declared
/// limit) beside pass and fail, and `rows_visible`; in schema 1 a vacuous
/// case was written as a pass. 3: `rows_basis` ("every": the verdict rests on
/// every query row; "sampled": on a sample of them) and, where every row was
/// asked for and could not be checked, `every_row_unavailable` (why).
/// 4: the histogram bin edges inside every judged case (`histogram_edges`),
/// the verdict and status `fault`, `magnitude_count` and the whole logit
/// condition; every record is written by core/record.cpp. 5: backward cases
/// (a problem line with pass=bwd) write `gradients` (dQ, dK, dV: each as `o`
/// is written), `kv_rows_checked` and `gradient_condition` instead of
/// `metrics` and `logit_condition`, and their baseline and peer `gradients`
/// (the peer with `gradient_max_ratio`, `gradient_rmse_ratio`).
inline constexpr int kRecordSchema = 5;
inline constexpr int kOldestReadableRecordSchema = 1;

/// A record that cannot be read: not JSON, not an object, a schema this build
/// does not read, a field missing or of the wrong type. what() says which.
class RecordError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The edges of the error histograms (ErrorStats::histogram, ulp_histogram),
/// bins + 1 values each: bin i holds [edges[i], edges[i+1]), except bin 0
/// (exact zeros: [0, 0]) and bin 1 ((0, edges[2])); the last edge is +inf.
/// Written inside each judged case, so that a reader never re-types them.
struct HistogramEdges {
  std::vector<double> log10;     // |error| (kHistogramBins bins)
  std::vector<double> ulp_log2;  // ULP distance in the output dtype (kUlpHistogramBins bins)
  friend bool operator==(const HistogramEdges&, const HistogramEdges&) = default;
};
/// The edges of this build's histograms (core/metrics.hpp's bins).
const HistogramEdges& histogram_edges();

/// A case's verdict as recorded: the judge's (pass, fail, vacuous, deviation),
/// a status that kept the case from running (unsupported, unavailable, fault,
/// error), or what a sweep saw of its worker (crash, timeout).
enum class CaseVerdict : std::uint8_t { pass, fail, vacuous, deviation, unsupported, unavailable, fault, error, crash, timeout };
std::string_view to_string(CaseVerdict verdict);
/// Throws RecordError for an unknown verdict.
CaseVerdict parse_case_verdict(std::string_view text);
/// Whether a verdict is a failure: anything but pass, vacuous, deviation,
/// unsupported and unavailable (which sweeps and reports count apart).
bool is_failure(CaseVerdict verdict);

/// Whether a verdict rests on every query row or on a sample of them.
enum class RowsBasis : std::uint8_t { every, sampled };

/// The judge's times for one case, in milliseconds.
struct CaseTiming {
  double inputs_ms = 0, subject_ms = 0, oracle_ms = 0, baseline_ms = 0;
  std::optional<double> subject_reported_ms;  // the subject's own time, where it reports one
  friend bool operator==(const CaseTiming&, const CaseTiming&) = default;
};

/// The same-precision baseline's errors against the f64 oracle.
struct BaselineRecord {
  std::string name;  // "cpu_lowp"
  DType dtype = DType::f32;
  CaseMetrics metrics;                       // pass=fwd
  std::optional<GradientMetrics> gradients;  // pass=bwd (schema >= 5)
  friend bool operator==(const BaselineRecord&, const BaselineRecord&) = default;
};

/// The peer's errors on the same case, and the subject's over the peer's.
struct PeerRecord {
  std::string name, version;
  CaseMetrics metrics;
  double o_max_ratio = 0, o_rmse_ratio = 0;
  // pass=bwd (schema >= 5): the peer's gradients, and the subject's worst ratio over dQ, dK and dV.
  std::optional<GradientMetrics> gradients;
  double gradient_max_ratio = 0, gradient_rmse_ratio = 0;
  friend bool operator==(const PeerRecord&, const PeerRecord&) = default;
};

/// What the judge decided about a case that ran (verdict pass, fail, vacuous
/// or deviation).
struct Judgement {
  std::string rule;  // the check that decided, in words
  std::int64_t rows_checked = 0;
  std::int64_t rows_visible = 0;  // checked rows (over heads) that see a key (schema >= 2)
  std::optional<RowsBasis> rows_basis;  // schema >= 3
  std::string every_row_unavailable;  // every row asked for and not checkable here: why (empty: absent)
  std::string deviation;              // verdict deviation: the declared limit (empty: absent)
  CaseMetrics metrics;                // subject vs the f64 oracle (pass=fwd; written as `metrics`)
  // pass=bwd (schema >= 5), written instead of `metrics`: the subject's
  // gradients vs the f64 gradient oracle, dQ on rows_checked query rows and dK,
  // dV on kv_rows_checked key rows, and the terms of the gradients' floor.
  std::optional<GradientMetrics> gradients;
  std::int64_t kv_rows_checked = 0;
  std::optional<GradientCondition> gradient_condition;
  std::optional<int> reruns;            // pass=bwd: the backward's reruns (JudgeOptions::backward_reruns)
  std::optional<double> rerun_spread;   // pass=bwd: the largest |difference| of a rerun from the first run
  BaselineRecord baseline;
  Verdict tolerance;
  std::optional<PeerRecord> peer;
  std::optional<LogitCondition> logit_condition;
  friend bool operator==(const Judgement&, const Judgement&) = default;
};

/// Where a sweep drew a case: the fuzz stream (seed, shard i of n) or the
/// sanitizer mode (seed, tool).
struct SweepOrigin {
  std::uint64_t seed = 0;
  std::optional<int> shard, shards;
  std::string sanitize;  // the compute-sanitizer tool (empty: the fuzz stream)
  friend bool operator==(const SweepOrigin&, const SweepOrigin&) = default;
};

/// A case run under compute-sanitizer (fuzz --sanitize).
struct SanitizerRun {
  std::string tool;
  int exit_code = 0;  // -1: killed or timed out
  std::string log;
  std::vector<std::string> report;  // the report's first lines
  friend bool operator==(const SanitizerRun&, const SanitizerRun&) = default;
};

/// One case: judged (run, replay, a sweep's worker), refused (unsupported,
/// unavailable), or lost (a worker's crash, timeout or error).
struct CaseRecord {
  int schema = kRecordSchema;  // as read; the writer writes kRecordSchema
  std::optional<std::int64_t> time;  // seconds since the epoch
  CaseVerdict verdict = CaseVerdict::error;
  std::string subject, problem;  // the problem line
  std::string reproducer;        // the command that replays the case (empty: absent)
  std::string message;           // why it did not run, or what failed (empty: absent)
  // Written by the judge; absent where a sweep lost the case.
  std::optional<Status> status;
  std::optional<DType> dtype;
  std::optional<std::uint64_t> geometry_seed, data_seed;
  std::optional<CaseTiming> timing;
  std::string subject_version;  // (empty: absent)
  std::optional<Judgement> judged;  // with the verdicts pass, fail, vacuous and deviation
  // Written by a sweep (fuzz/).
  std::string case_key;  // "case" (empty: absent)
  std::string check;     // the check that failed, for the summary (empty: absent)
  std::optional<double> worst_ratio;
  std::optional<SweepOrigin> sweep;
  std::string shrunk_problem;  // (empty: absent)
  std::optional<SanitizerRun> sanitizer;

  bool failed() const { return is_failure(verdict); }
  friend bool operator==(const CaseRecord&, const CaseRecord&) = default;
};

/// One bench timing of a (subject, problem) pair (`kind: bench`).
struct BenchRecord {
  int schema = kRecordSchema;
  std::optional<std::int64_t> time;
  std::string subject, problem;
  bool peer = false;  // this row is the peer's own timing
  std::optional<DType> dtype;
  std::string bound;  // "memory" or "compute" (empty: absent)
  double median_ms = 0, min_ms = 0, max_ms = 0;
  std::vector<double> samples_ms;
  std::optional<double> flops, tflops, fraction_of_gemm, bytes, gbps, fraction_of_copy;
  /// gbps over the read-only ceiling (CeilingRecord::read_gbps), where it was measured.
  std::optional<double> fraction_of_read;
  std::optional<int> warmup, repeats, input_sets;
  std::string device;  // (empty: absent)
  std::optional<double> speed_vs_peer;  // the peer's median over this one's (above 1: faster)
  std::string peer_subject;             // the peer it was compared with (read "cudnn" from speed_vs_cudnn)
  friend bool operator==(const BenchRecord&, const BenchRecord&) = default;
};

/// The bench's measured ceilings on a device (`kind: ceiling`).
struct CeilingRecord {
  int schema = kRecordSchema;
  std::optional<std::int64_t> time;
  std::string device;
  double gemm_bf16_tflops = 0, gemm_f32_tflops = 0, copy_gbps = 0;
  /// Bytes read per second by a kernel that writes almost nothing (absent
  /// from records written before it was measured).
  std::optional<double> read_gbps;
  std::optional<double> l2_bytes;
  std::string method;  // (empty: absent)
  friend bool operator==(const CeilingRecord&, const CeilingRecord&) = default;
};

/// Any record of a records file.
using Record = std::variant<CaseRecord, BenchRecord, CeilingRecord>;

/// Seconds since the epoch, for `time`.
std::int64_t record_time_now();

// The writer. JSON has no Inf or NaN: such numbers are written as the
// strings "inf", "-inf" and "nan".
void to_json(nlohmann::json& j, const ErrorStats& stats);
void to_json(nlohmann::json& j, const TensorMetrics& metrics);
void to_json(nlohmann::json& j, const CaseMetrics& metrics);
void to_json(nlohmann::json& j, const GradientMetrics& metrics);
void to_json(nlohmann::json& j, const GradientCondition& condition);
void to_json(nlohmann::json& j, const Verdict& verdict);
void to_json(nlohmann::json& j, const LogitCondition& condition);
void to_json(nlohmann::json& j, const CaseRecord& record);
void to_json(nlohmann::json& j, const BenchRecord& record);
void to_json(nlohmann::json& j, const CeilingRecord& record);
void to_json(nlohmann::json& j, const Record& record);
/// A record as one line of JSON (no newline).
std::string dump_record(const Record& record);

// The reader: throws RecordError naming the field that is missing or wrong.
void from_json(const nlohmann::json& j, ErrorStats& stats);
void from_json(const nlohmann::json& j, TensorMetrics& metrics);
void from_json(const nlohmann::json& j, CaseMetrics& metrics);
void from_json(const nlohmann::json& j, Verdict& verdict);
void from_json(const nlohmann::json& j, LogitCondition& condition);
void from_json(const nlohmann::json& j, CaseRecord& record);
void from_json(const nlohmann::json& j, BenchRecord& record);
void from_json(const nlohmann::json& j, CeilingRecord& record);
/// A record of any kind (`kind` bench or ceiling, else a case).
Record read_record(const nlohmann::json& j);
/// A record from one line of a records file.
Record parse_record(std::string_view line);

/// Appends records to a JSON Lines file.
class RecordWriter {
 public:
  /// Opens (creating parent folders and the file) for appending. Throws
  /// std::runtime_error naming the path when it cannot.
  explicit RecordWriter(const std::string& path);
  /// Writes one record as one line and flushes it to the OS.
  void write(const Record& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream stream_;
};

}  // namespace flashcheck
