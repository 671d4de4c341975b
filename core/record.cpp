#include "flashcheck/core/record.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <stdexcept>

namespace flashcheck {
namespace {

// JSON has no Inf/NaN: such values are written as strings.
nlohmann::json number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

nlohmann::json to_json(const Mismatch& m) {
  return {{"b", m.at.b}, {"h", m.at.h}, {"row", m.at.row}, {"column", m.at.column},
          {"got", number(m.got)}, {"want", number(m.want)}, {"abs_error", number(m.abs_error)}};
}

}  // namespace

nlohmann::json to_json(const ErrorStats& s) {
  nlohmann::json j = {{"count", s.count},
                      {"max_abs", number(s.max_abs)},
                      {"max_rel", number(s.max_rel)},
                      {"rmse", number(s.rmse)},
                      {"p50", number(s.p50)},
                      {"p99", number(s.p99)},
                      {"p999", number(s.p999)},
                      {"normwise_rel", number(s.normwise_rel)},
                      {"max_ulp", number(s.max_ulp)},
                      {"p99_ulp", number(s.p99_ulp)},
                      {"mean_signed", number(s.mean_signed)},
                      {"bias_t", number(s.bias_t)},
                      {"mean_magnitude", number(s.mean_magnitude)},
                      {"magnitude_t", number(s.magnitude_t)},
                      {"ref_max_abs", number(s.ref_max_abs)},
                      {"ref_rms", number(s.ref_rms)},
                      {"histogram_log10", s.histogram},
                      {"histogram_ulp_log2", s.ulp_histogram}};
  if (s.worst) j["worst"] = to_json(*s.worst);
  return j;
}

nlohmann::json to_json(const TensorMetrics& m) {
  nlohmann::json census = {{"got_nan", m.census.got_nan},       {"got_pos_inf", m.census.got_pos_inf},
                           {"got_neg_inf", m.census.got_neg_inf}, {"want_nan", m.census.want_nan},
                           {"want_pos_inf", m.census.want_pos_inf}, {"want_neg_inf", m.census.want_neg_inf},
                           {"mismatches", m.census.mismatches}};
  if (m.census.first_mismatch) census["first_mismatch"] = to_json(*m.census.first_mismatch);
  nlohmann::json j = {{"errors", to_json(m.errors)}, {"census", census}, {"over_bound", m.over_bound}};
  if (m.first_over_bound) j["first_over_bound"] = to_json(*m.first_over_bound);
  return j;
}

nlohmann::json to_json(const CaseMetrics& m) {
  nlohmann::json j = {{"o", to_json(m.o)}, {"rows_compared", m.rows_compared}};
  if (m.has_lse) j["lse"] = to_json(m.lse);
  return j;
}

nlohmann::json to_json(const Verdict& v) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : v.checks)
    checks.push_back({{"metric", c.metric}, {"subject", number(c.subject)}, {"baseline", number(c.baseline)},
                      {"floor", number(c.floor)}, {"bound", number(c.bound)}, {"ratio", number(c.ratio)},
                      {"pass", c.pass}});
  return {{"pass", v.pass}, {"rule", v.rule}, {"census_pass", v.census_pass}, {"worst_ratio", number(v.worst_ratio)},
          {"checks", checks}};
}

RecordWriter::RecordWriter(const std::string& path) : path_(path) {
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  stream_.open(path, std::ios::app);
  if (!stream_) throw std::runtime_error(fmt::format("cannot open record file '{}' for appending", path));
}

void RecordWriter::write(const nlohmann::json& record) {
  stream_ << record.dump() << '\n';
  stream_.flush();
  if (!stream_) throw std::runtime_error(fmt::format("writing to record file '{}' failed", path_));
}

}  // namespace flashcheck
