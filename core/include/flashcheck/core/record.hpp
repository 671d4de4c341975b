// Records: one JSON object per case, appended to a JSON Lines file and flushed
// per case, so that a killed run loses at most the case in flight.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "flashcheck/core/metrics.hpp"
#include "flashcheck/core/tolerance.hpp"

namespace flashcheck {

/// Version of the record format; readers refuse records from other versions.
/// 2: the verdicts `vacuous` (nothing compared) and `deviation` (a declared
/// limit) beside pass and fail, and `rows_visible`; in schema 1 a vacuous
/// case was written as a pass. 3: `rows_basis` ("every": the verdict rests on
/// every query row; "sampled": on a sample of them) and, where every row was
/// asked for and could not be checked, `every_row_unavailable` (why).
inline constexpr int kRecordSchema = 3;

nlohmann::json to_json(const ErrorStats& stats);
nlohmann::json to_json(const TensorMetrics& metrics);
nlohmann::json to_json(const CaseMetrics& metrics);
nlohmann::json to_json(const Verdict& verdict);

/// Appends records to a JSON Lines file.
class RecordWriter {
 public:
  /// Opens (creating parent folders and the file) for appending. Throws
  /// std::runtime_error naming the path when it cannot.
  explicit RecordWriter(const std::string& path);
  /// Writes one record as one line and flushes it to the OS.
  void write(const nlohmann::json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream stream_;
};

}  // namespace flashcheck
