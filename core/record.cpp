#include "flashcheck/core/record.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>

namespace flashcheck {

using nlohmann::json;

// ---- vocabulary -------------------------------------------------------------------------------

const HistogramEdges& histogram_edges() {
  static const HistogramEdges edges = [] {
    HistogramEdges e;
    // Bin 0 holds exact zeros ([0, 0]), bin 1 (0, first power); then one bin per power.
    e.log10 = {0.0, 0.0};
    for (int bin = 2; bin < kHistogramBins; ++bin) e.log10.push_back(histogram_bin_floor(bin));
    e.log10.push_back(std::numeric_limits<double>::infinity());
    e.ulp_log2 = {0.0, 0.0};
    for (int bin = 2; bin < kUlpHistogramBins; ++bin) e.ulp_log2.push_back(std::ldexp(1.0, bin - 10));  // 2^-8 .. 2^20
    e.ulp_log2.push_back(std::numeric_limits<double>::infinity());
    return e;
  }();
  return edges;
}

namespace {

constexpr CaseVerdict kVerdicts[] = {CaseVerdict::pass,        CaseVerdict::fail,        CaseVerdict::vacuous,
                                     CaseVerdict::deviation,   CaseVerdict::unsupported, CaseVerdict::unavailable,
                                     CaseVerdict::fault,       CaseVerdict::error,       CaseVerdict::crash,
                                     CaseVerdict::timeout};
constexpr Status kStatuses[] = {Status::ok, Status::unsupported, Status::unavailable, Status::fault, Status::error};

}  // namespace

std::string_view to_string(CaseVerdict verdict) {
  switch (verdict) {
    case CaseVerdict::pass: return "pass";
    case CaseVerdict::fail: return "fail";
    case CaseVerdict::vacuous: return "vacuous";
    case CaseVerdict::deviation: return "deviation";
    case CaseVerdict::unsupported: return "unsupported";
    case CaseVerdict::unavailable: return "unavailable";
    case CaseVerdict::fault: return "fault";
    case CaseVerdict::error: return "error";
    case CaseVerdict::crash: return "crash";
    case CaseVerdict::timeout: return "timeout";
  }
  return "?";
}

CaseVerdict parse_case_verdict(std::string_view text) {
  for (CaseVerdict verdict : kVerdicts)
    if (to_string(verdict) == text) return verdict;
  throw RecordError(fmt::format("verdict: unknown verdict '{}'", text.substr(0, 80)));
}

bool is_failure(CaseVerdict verdict) {
  switch (verdict) {
    case CaseVerdict::pass:
    case CaseVerdict::vacuous:
    case CaseVerdict::deviation:
    case CaseVerdict::unsupported:
    case CaseVerdict::unavailable: return false;
    default: return true;
  }
}

std::int64_t record_time_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- the writer --------------------------------------------------------------------------------

namespace {

// JSON has no Inf/NaN: such values are written as strings.
json number(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  return x;
}

json numbers(const std::vector<double>& xs) {
  json array = json::array();
  for (double x : xs) array.push_back(number(x));
  return array;
}

json to_json(const Mismatch& m) {
  return {{"b", m.at.b}, {"h", m.at.h}, {"row", m.at.row}, {"column", m.at.column},
          {"got", number(m.got)}, {"want", number(m.want)}, {"abs_error", number(m.abs_error)}};
}

json to_json(const CaseTiming& t) {
  json j = {{"inputs", t.inputs_ms}, {"subject", t.subject_ms}, {"oracle", t.oracle_ms}, {"baseline", t.baseline_ms}};
  if (t.subject_reported_ms) j["subject_reported"] = *t.subject_reported_ms;
  return j;
}

template <class T>
void put(json& j, const char* key, const std::optional<T>& value) {
  if (value) j[key] = *value;
}
void put(json& j, const char* key, const std::string& value) {
  if (!value.empty()) j[key] = value;
}

}  // namespace

void to_json(json& j, const ErrorStats& s) {
  j = {{"count", s.count},
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
       {"rounding_mean", number(s.rounding_mean)},
       {"tie_slack", number(s.tie_slack)},
       {"magnitude_count", s.magnitude_count},
       {"mean_magnitude", number(s.mean_magnitude)},
       {"magnitude_t", number(s.magnitude_t)},
       {"ref_max_abs", number(s.ref_max_abs)},
       {"ref_rms", number(s.ref_rms)},
       {"histogram_log10", s.histogram},
       {"histogram_ulp_log2", s.ulp_histogram}};
  if (s.worst) j["worst"] = to_json(*s.worst);
}

void to_json(json& j, const TensorMetrics& m) {
  json census = {{"got_nan", m.census.got_nan},         {"got_pos_inf", m.census.got_pos_inf},
                 {"got_neg_inf", m.census.got_neg_inf}, {"want_nan", m.census.want_nan},
                 {"want_pos_inf", m.census.want_pos_inf}, {"want_neg_inf", m.census.want_neg_inf},
                 {"mismatches", m.census.mismatches}};
  if (m.census.first_mismatch) census["first_mismatch"] = to_json(*m.census.first_mismatch);
  j = {{"errors", m.errors}, {"census", census}, {"over_bound", m.over_bound}};
  if (m.first_over_bound) j["first_over_bound"] = to_json(*m.first_over_bound);
}

void to_json(json& j, const CaseMetrics& m) {
  j = {{"o", m.o}, {"rows_compared", m.rows_compared}};
  if (m.has_lse) j["lse"] = m.lse;
}

void to_json(json& j, const GradientMetrics& m) {
  j = {{"dq", m.dq},
       {"dk", m.dk},
       {"dv", m.dv},
       {"q_rows_compared", m.q_rows_compared},
       {"kv_rows_compared", m.kv_rows_compared}};
}

void to_json(json& j, const GradientCondition& c) {
  j = {{"dq_terms", number(c.dq_terms)},         {"dkv_terms", number(c.dkv_terms)},
       {"dq_terms_max", number(c.dq_terms_max)}, {"dk_terms_max", number(c.dk_terms_max)},
       {"dv_terms_max", number(c.dv_terms_max)}, {"dq_logit_terms_max", number(c.dq_logit_terms_max)},
       {"dk_logit_terms_max", number(c.dk_logit_terms_max)}, {"dv_logit_terms_max", number(c.dv_logit_terms_max)},
       {"dq_delta", number(c.dq_delta)},         {"dk_delta", number(c.dk_delta)},
       {"operand_roundoff", number(c.operand_roundoff)}};
}

void to_json(json& j, const Verdict& v) {
  json checks = json::array();
  for (const auto& c : v.checks)
    checks.push_back({{"metric", c.metric}, {"subject", number(c.subject)}, {"baseline", number(c.baseline)},
                      {"floor", number(c.floor)}, {"bound", number(c.bound)}, {"ratio", number(c.ratio)},
                      {"pass", c.pass}});
  j = {{"pass", v.pass}, {"rule", v.rule}, {"census_pass", v.census_pass}, {"worst_ratio", number(v.worst_ratio)},
       {"checks", checks}};
}

void to_json(json& j, const LogitCondition& c) {
  j = {{"head_dim", c.head_dim},   {"input_unit", number(c.input_unit)}, {"product_unit", number(c.product_unit)},
       {"o_max", number(c.o_max)}, {"o_rms", number(c.o_rms)},
       {"lse_max", number(c.lse_max)}, {"lse_rms", number(c.lse_rms)},
       {"accumulation_o", number(c.accumulation_o)}, {"accumulation_lse", number(c.accumulation_lse)}};
}

void to_json(json& j, const CaseRecord& r) {
  j = {{"schema", kRecordSchema}, {"verdict", std::string(to_string(r.verdict))}, {"subject", r.subject},
       {"problem", r.problem}};
  put(j, "time", r.time);
  put(j, "reproducer", r.reproducer);
  put(j, "message", r.message);
  if (r.status) j["status"] = std::string(to_string(*r.status));
  if (r.dtype) j["dtype"] = std::string(to_string(*r.dtype));
  put(j, "geometry_seed", r.geometry_seed);
  put(j, "data_seed", r.data_seed);
  if (r.timing) j["timing_ms"] = to_json(*r.timing);
  put(j, "subject_version", r.subject_version);
  if (r.judged) {
    const Judgement& d = *r.judged;
    j["rule"] = d.rule;
    j["rows_checked"] = d.rows_checked;
    j["rows_visible"] = d.rows_visible;
    if (d.rows_basis) j["rows_basis"] = *d.rows_basis == RowsBasis::every ? "every" : "sampled";
    put(j, "every_row_unavailable", d.every_row_unavailable);
    put(j, "deviation", d.deviation);
    // A forward case writes `metrics` (O, LSE); a backward one `gradients`
    // (dQ, dK, dV), in the same places of the baseline and the peer.
    if (d.gradients) {
      j["gradients"] = *d.gradients;
      j["kv_rows_checked"] = d.kv_rows_checked;
      if (d.gradient_condition) j["gradient_condition"] = *d.gradient_condition;
      put(j, "reruns", d.reruns);
      if (d.rerun_spread) j["rerun_spread"] = number(*d.rerun_spread);
    } else {
      j["metrics"] = d.metrics;
    }
    j["baseline"] = {{"name", d.baseline.name}, {"dtype", std::string(to_string(d.baseline.dtype))}};
    if (d.baseline.gradients)
      j["baseline"]["gradients"] = *d.baseline.gradients;
    else
      j["baseline"]["metrics"] = d.baseline.metrics;
    j["tolerance"] = d.tolerance;
    if (d.peer) {
      j["peer"] = {{"name", d.peer->name}, {"version", d.peer->version}};
      if (d.peer->gradients) {
        j["peer"]["gradients"] = *d.peer->gradients;
        j["peer"]["gradient_max_ratio"] = number(d.peer->gradient_max_ratio);
        j["peer"]["gradient_rmse_ratio"] = number(d.peer->gradient_rmse_ratio);
      } else {
        j["peer"]["metrics"] = d.peer->metrics;
        j["peer"]["o_max_ratio"] = number(d.peer->o_max_ratio);
        j["peer"]["o_rmse_ratio"] = number(d.peer->o_rmse_ratio);
      }
    }
    if (d.logit_condition) j["logit_condition"] = *d.logit_condition;
    const HistogramEdges& edges = histogram_edges();
    j["histogram_edges"] = {{"log10", numbers(edges.log10)}, {"ulp_log2", numbers(edges.ulp_log2)}};
  }
  put(j, "case", r.case_key);
  put(j, "check", r.check);
  if (r.worst_ratio) j["worst_ratio"] = number(*r.worst_ratio);
  if (r.sweep) {
    json sweep = {{"seed", r.sweep->seed}};
    put(sweep, "shard", r.sweep->shard);
    put(sweep, "shards", r.sweep->shards);
    put(sweep, "sanitize", r.sweep->sanitize);
    j["sweep"] = sweep;
  }
  put(j, "shrunk_problem", r.shrunk_problem);
  if (r.sanitizer)
    j["sanitizer"] = {{"tool", r.sanitizer->tool}, {"exit_code", r.sanitizer->exit_code}, {"log", r.sanitizer->log},
                      {"report", r.sanitizer->report}};
}

void to_json(json& j, const BenchRecord& r) {
  j = {{"schema", kRecordSchema}, {"kind", "bench"},       {"subject", r.subject}, {"peer", r.peer},
       {"problem", r.problem},    {"median_ms", r.median_ms}, {"min_ms", r.min_ms},   {"max_ms", r.max_ms},
       {"samples_ms", r.samples_ms}};
  put(j, "time", r.time);
  if (r.dtype) j["dtype"] = std::string(to_string(*r.dtype));
  put(j, "bound", r.bound);
  for (const auto& [key, value] : {std::pair{"flops", r.flops}, {"tflops", r.tflops}, {"fraction_of_gemm", r.fraction_of_gemm},
                                   {"bytes", r.bytes}, {"gbps", r.gbps}, {"fraction_of_copy", r.fraction_of_copy},
                                   {"fraction_of_read", r.fraction_of_read}})
    if (value) j[key] = number(*value);
  put(j, "warmup", r.warmup);
  put(j, "repeats", r.repeats);
  put(j, "input_sets", r.input_sets);
  put(j, "device", r.device);
  put(j, "speed_vs_peer", r.speed_vs_peer);
  put(j, "peer_subject", r.peer_subject);
}

void to_json(json& j, const CeilingRecord& r) {
  j = {{"schema", kRecordSchema},           {"kind", "ceiling"},
       {"device", r.device},                {"gemm_bf16_tflops", r.gemm_bf16_tflops},
       {"gemm_f32_tflops", r.gemm_f32_tflops}, {"copy_gbps", r.copy_gbps}};
  put(j, "time", r.time);
  put(j, "read_gbps", r.read_gbps);
  put(j, "l2_bytes", r.l2_bytes);
  put(j, "method", r.method);
}

void to_json(json& j, const Record& record) {
  std::visit([&j](const auto& r) { to_json(j, r); }, record);
}

std::string dump_record(const Record& record) {
  json j;
  to_json(j, record);
  // Invalid UTF-8 in a subject's message is replaced, never a throw mid-sweep.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// ---- the reader --------------------------------------------------------------------------------

namespace {

// Every reader names where it is ("metrics.o.errors.max_abs") in its errors.
std::string at(std::string_view where, std::string_view key) {
  return where.empty() ? std::string(key) : fmt::format("{}.{}", where, key);
}

[[noreturn]] void wrong(std::string_view where, std::string_view what) {
  throw RecordError(fmt::format("{}: {}", where.empty() ? "the record" : where, what));
}

const json& object(const json& j, std::string_view where) {
  if (!j.is_object()) wrong(where, "not an object");
  return j;
}

const json* find(const json& j, std::string_view key) {
  const auto found = j.find(key);
  return found == j.end() ? nullptr : &*found;
}

const json& need(const json& j, std::string_view key, std::string_view where) {
  const json* value = find(j, key);
  if (!value) wrong(where, fmt::format("no '{}'", key));
  return *value;
}

// A real number: a number, or "nan"/"inf"/"-inf" (the writer's), or null (older writers' NaN).
double real(const json& v, std::string_view where) {
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  wrong(where, "not a number");
}

std::int64_t integer(const json& v, std::string_view where) {
  if (!v.is_number_integer()) wrong(where, "not an integer");
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    wrong(where, "out of range");
  return v.get<std::int64_t>();
}

std::uint64_t unsigned_integer(const json& v, std::string_view where) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<std::int64_t>() < 0))
    wrong(where, "not a non-negative integer");
  return v.get<std::uint64_t>();
}

int small_integer(const json& v, std::string_view where) {
  const std::int64_t x = integer(v, where);
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) wrong(where, "out of range");
  return static_cast<int>(x);
}

const std::string& text(const json& v, std::string_view where) {
  if (!v.is_string()) wrong(where, "not a string");
  return v.get_ref<const std::string&>();
}

bool boolean(const json& v, std::string_view where) {
  if (!v.is_boolean()) wrong(where, "not a boolean");
  return v.get<bool>();
}

DType dtype(const json& v, std::string_view where) {
  const auto parsed = parse_dtype(text(v, where));
  if (!parsed) wrong(where, "not a dtype");
  return *parsed;
}

// Field readers: required (need_*) and optional (an absent field leaves the default).
double need_real(const json& j, std::string_view key, std::string_view where) {
  return real(need(j, key, where), at(where, key));
}
std::int64_t need_integer(const json& j, std::string_view key, std::string_view where) {
  return integer(need(j, key, where), at(where, key));
}
std::string need_text(const json& j, std::string_view key, std::string_view where) {
  return text(need(j, key, where), at(where, key));
}
std::string optional_text(const json& j, std::string_view key, std::string_view where) {
  const json* v = find(j, key);
  return v ? text(*v, at(where, key)) : std::string();
}
std::optional<double> optional_real(const json& j, std::string_view key, std::string_view where) {
  const json* v = find(j, key);
  return v ? std::optional<double>(real(*v, at(where, key))) : std::nullopt;
}
std::optional<std::int64_t> optional_integer(const json& j, std::string_view key, std::string_view where) {
  const json* v = find(j, key);
  return v ? std::optional<std::int64_t>(integer(*v, at(where, key))) : std::nullopt;
}
std::optional<int> optional_small_integer(const json& j, std::string_view key, std::string_view where) {
  const json* v = find(j, key);
  return v ? std::optional<int>(small_integer(*v, at(where, key))) : std::nullopt;
}
std::optional<std::uint64_t> optional_unsigned(const json& j, std::string_view key, std::string_view where) {
  const json* v = find(j, key);
  return v ? std::optional<std::uint64_t>(unsigned_integer(*v, at(where, key))) : std::nullopt;
}

template <std::size_t N>
void read_histogram(const json& j, std::string_view key, std::string_view where, std::array<std::int64_t, N>& counts) {
  const json* v = find(j, key);
  if (!v) return;  // older records may lack the ULP histogram
  const std::string here = at(where, key);
  if (!v->is_array() || v->size() != N) wrong(here, fmt::format("not an array of {} counts", N));
  for (std::size_t i = 0; i < N; ++i) counts[i] = integer((*v)[i], fmt::format("{}[{}]", here, i));
}

std::optional<Mismatch> read_mismatch(const json& j, std::string_view key, std::string_view where) {
  const json* v = find(j, key);
  if (!v) return std::nullopt;
  const std::string here = at(where, key);
  object(*v, here);
  Mismatch m;
  m.at = {need_integer(*v, "b", here), need_integer(*v, "h", here), need_integer(*v, "row", here),
          need_integer(*v, "column", here)};
  m.got = need_real(*v, "got", here);
  m.want = need_real(*v, "want", here);
  m.abs_error = need_real(*v, "abs_error", here);
  return m;
}

ErrorStats read_stats(const json& j, std::string_view where) {
  object(j, where);
  ErrorStats s;
  s.count = need_integer(j, "count", where);
  s.max_abs = need_real(j, "max_abs", where);
  s.rmse = need_real(j, "rmse", where);
  for (auto [key, field] : {std::pair{"max_rel", &s.max_rel}, {"p50", &s.p50}, {"p99", &s.p99}, {"p999", &s.p999},
                            {"normwise_rel", &s.normwise_rel}, {"max_ulp", &s.max_ulp}, {"p99_ulp", &s.p99_ulp},
                            {"mean_signed", &s.mean_signed}, {"bias_t", &s.bias_t},
                            {"rounding_mean", &s.rounding_mean}, {"tie_slack", &s.tie_slack},
                            {"mean_magnitude", &s.mean_magnitude}, {"magnitude_t", &s.magnitude_t},
                            {"ref_max_abs", &s.ref_max_abs}, {"ref_rms", &s.ref_rms}})
    *field = optional_real(j, key, where).value_or(0.0);
  s.magnitude_count = optional_integer(j, "magnitude_count", where).value_or(0);
  if (!find(j, "histogram_log10")) wrong(where, "no 'histogram_log10'");
  read_histogram(j, "histogram_log10", where, s.histogram);
  read_histogram(j, "histogram_ulp_log2", where, s.ulp_histogram);
  s.worst = read_mismatch(j, "worst", where);
  return s;
}

TensorMetrics read_tensor(const json& j, std::string_view where) {
  object(j, where);
  TensorMetrics m;
  m.errors = read_stats(need(j, "errors", where), at(where, "errors"));
  const std::string census_at = at(where, "census");
  const json& census = object(need(j, "census", where), census_at);
  for (auto [key, field] : {std::pair{"got_nan", &m.census.got_nan}, {"got_pos_inf", &m.census.got_pos_inf},
                            {"got_neg_inf", &m.census.got_neg_inf}, {"want_nan", &m.census.want_nan},
                            {"want_pos_inf", &m.census.want_pos_inf}, {"want_neg_inf", &m.census.want_neg_inf},
                            {"mismatches", &m.census.mismatches}})
    *field = optional_integer(census, key, census_at).value_or(0);
  m.census.first_mismatch = read_mismatch(census, "first_mismatch", census_at);
  m.over_bound = optional_integer(j, "over_bound", where).value_or(0);
  m.first_over_bound = read_mismatch(j, "first_over_bound", where);
  return m;
}

CaseMetrics read_case_metrics(const json& j, std::string_view where) {
  object(j, where);
  CaseMetrics m;
  m.o = read_tensor(need(j, "o", where), at(where, "o"));
  if (const json* lse = find(j, "lse")) {
    m.lse = read_tensor(*lse, at(where, "lse"));
    m.has_lse = true;
  }
  m.rows_compared = optional_integer(j, "rows_compared", where).value_or(0);
  return m;
}

GradientMetrics read_gradient_metrics(const json& j, std::string_view where) {
  object(j, where);
  GradientMetrics m;
  m.dq = read_tensor(need(j, "dq", where), at(where, "dq"));
  m.dk = read_tensor(need(j, "dk", where), at(where, "dk"));
  m.dv = read_tensor(need(j, "dv", where), at(where, "dv"));
  m.q_rows_compared = optional_integer(j, "q_rows_compared", where).value_or(0);
  m.kv_rows_compared = optional_integer(j, "kv_rows_compared", where).value_or(0);
  return m;
}

Verdict read_verdict(const json& j, std::string_view where) {
  object(j, where);
  Verdict v;
  v.pass = boolean(need(j, "pass", where), at(where, "pass"));
  v.rule = need_text(j, "rule", where);
  if (const json* census = find(j, "census_pass")) v.census_pass = boolean(*census, at(where, "census_pass"));
  v.worst_ratio = optional_real(j, "worst_ratio", where).value_or(0.0);
  const json& checks = need(j, "checks", where);
  if (!checks.is_array()) wrong(at(where, "checks"), "not an array");
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const std::string here = fmt::format("{}[{}]", at(where, "checks"), i);
    const json& c = object(checks[i], here);
    v.checks.push_back({need_text(c, "metric", here), need_real(c, "subject", here), need_real(c, "baseline", here),
                        need_real(c, "floor", here), need_real(c, "bound", here), need_real(c, "ratio", here),
                        boolean(need(c, "pass", here), at(here, "pass"))});
  }
  return v;
}

LogitCondition read_condition(const json& j, std::string_view where) {
  object(j, where);
  LogitCondition c;
  c.head_dim = optional_integer(j, "head_dim", where).value_or(c.head_dim);
  for (auto [key, field] : {std::pair{"input_unit", &c.input_unit}, {"product_unit", &c.product_unit},
                            {"o_max", &c.o_max}, {"o_rms", &c.o_rms},
                            {"lse_max", &c.lse_max}, {"lse_rms", &c.lse_rms}, {"accumulation_o", &c.accumulation_o},
                            {"accumulation_lse", &c.accumulation_lse}})
    *field = optional_real(j, key, where).value_or(0.0);
  return c;
}

int read_schema(const json& j) {
  const int schema = small_integer(need(j, "schema", ""), "schema");
  if (schema < kOldestReadableRecordSchema || schema > kRecordSchema)
    throw RecordError(fmt::format("a record of schema {}; this build reads schema {} to {}", schema,
                                  kOldestReadableRecordSchema, kRecordSchema));
  return schema;
}

Status read_status(const json& v, std::string_view where) {
  const std::string& s = text(v, where);
  for (Status status : kStatuses)
    if (to_string(status) == s) return status;
  wrong(where, fmt::format("unknown status '{}'", s.substr(0, 80)));
}

bool judged_verdict(CaseVerdict v) {
  return v == CaseVerdict::pass || v == CaseVerdict::fail || v == CaseVerdict::vacuous || v == CaseVerdict::deviation;
}

void check_edges(const json& j) {
  // The edges are a property of the format: fixed-size histograms (metrics.hpp)
  // cannot hold counts binned otherwise.
  const json* edges = find(j, "histogram_edges");
  if (!edges) return;  // schema < 4
  object(*edges, "histogram_edges");
  const HistogramEdges& ours = histogram_edges();
  for (auto [key, want] : {std::pair{"log10", &ours.log10}, {"ulp_log2", &ours.ulp_log2}}) {
    const std::string here = at("histogram_edges", key);
    const json& got = need(*edges, key, "histogram_edges");
    if (!got.is_array() || got.size() != want->size()) wrong(here, fmt::format("not {} edges", want->size()));
    for (std::size_t i = 0; i < want->size(); ++i) {
      const double edge = real(got[i], fmt::format("{}[{}]", here, i));
      if (edge != (*want)[i])
        wrong(here, fmt::format("edge {} is {}, this build's histograms have {}", i, edge, (*want)[i]));
    }
  }
}

}  // namespace

void from_json(const json& j, ErrorStats& stats) { stats = read_stats(j, ""); }
void from_json(const json& j, TensorMetrics& metrics) { metrics = read_tensor(j, ""); }
void from_json(const json& j, CaseMetrics& metrics) { metrics = read_case_metrics(j, ""); }
void from_json(const json& j, Verdict& verdict) { verdict = read_verdict(j, ""); }
void from_json(const json& j, LogitCondition& condition) { condition = read_condition(j, ""); }

void from_json(const json& j, CaseRecord& r) {
  object(j, "");
  r = CaseRecord{};
  r.schema = read_schema(j);
  r.time = optional_integer(j, "time", "");
  r.verdict = parse_case_verdict(need_text(j, "verdict", ""));
  r.subject = optional_text(j, "subject", "");
  r.problem = optional_text(j, "problem", "");
  r.reproducer = optional_text(j, "reproducer", "");
  r.message = optional_text(j, "message", "");
  if (const json* status = find(j, "status")) r.status = read_status(*status, "status");
  if (const json* d = find(j, "dtype")) r.dtype = dtype(*d, "dtype");
  r.geometry_seed = optional_unsigned(j, "geometry_seed", "");
  r.data_seed = optional_unsigned(j, "data_seed", "");
  if (const json* t = find(j, "timing_ms")) {
    object(*t, "timing_ms");
    CaseTiming timing;
    for (auto [key, field] : {std::pair{"inputs", &timing.inputs_ms}, {"subject", &timing.subject_ms},
                              {"oracle", &timing.oracle_ms}, {"baseline", &timing.baseline_ms}})
      *field = optional_real(*t, key, "timing_ms").value_or(0.0);
    timing.subject_reported_ms = optional_real(*t, "subject_reported", "timing_ms");
    r.timing = timing;
  }
  r.subject_version = optional_text(j, "subject_version", "");
  if (judged_verdict(r.verdict)) {
    Judgement d;
    d.rule = need_text(j, "rule", "");
    d.rows_checked = optional_integer(j, "rows_checked", "").value_or(0);
    d.rows_visible = optional_integer(j, "rows_visible", "").value_or(0);
    if (const json* basis = find(j, "rows_basis")) {
      const std::string& b = text(*basis, "rows_basis");
      if (b != "every" && b != "sampled") wrong("rows_basis", "neither 'every' nor 'sampled'");
      d.rows_basis = b == "every" ? RowsBasis::every : RowsBasis::sampled;
    }
    d.every_row_unavailable = optional_text(j, "every_row_unavailable", "");
    d.deviation = optional_text(j, "deviation", "");
    if (const json* gradients = find(j, "gradients")) {
      d.gradients = read_gradient_metrics(*gradients, "gradients");
      d.kv_rows_checked = optional_integer(j, "kv_rows_checked", "").value_or(0);
      if (const json* c = find(j, "gradient_condition")) {
        object(*c, "gradient_condition");
        GradientCondition condition;
        condition.dq_terms = optional_real(*c, "dq_terms", "gradient_condition").value_or(1.0);
        condition.dkv_terms = optional_real(*c, "dkv_terms", "gradient_condition").value_or(1.0);
        for (auto [key, field] : {std::pair{"dq_terms_max", &condition.dq_terms_max},
                                  {"dk_terms_max", &condition.dk_terms_max},
                                  {"dv_terms_max", &condition.dv_terms_max},
                                  {"dq_logit_terms_max", &condition.dq_logit_terms_max},
                                  {"dk_logit_terms_max", &condition.dk_logit_terms_max},
                                  {"dv_logit_terms_max", &condition.dv_logit_terms_max},
                                  {"dq_delta", &condition.dq_delta}, {"dk_delta", &condition.dk_delta},
                                  {"operand_roundoff", &condition.operand_roundoff}})
          *field = optional_real(*c, key, "gradient_condition").value_or(0.0);
        d.gradient_condition = condition;
      }
      d.reruns = optional_small_integer(j, "reruns", "");
      d.rerun_spread = optional_real(j, "rerun_spread", "");
    } else {
      d.metrics = read_case_metrics(need(j, "metrics", ""), "metrics");
    }
    d.tolerance = read_verdict(need(j, "tolerance", ""), "tolerance");
    if (const json* baseline = find(j, "baseline")) {
      object(*baseline, "baseline");
      d.baseline.name = need_text(*baseline, "name", "baseline");
      d.baseline.dtype = dtype(need(*baseline, "dtype", "baseline"), "baseline.dtype");
      if (const json* gradients = find(*baseline, "gradients"))
        d.baseline.gradients = read_gradient_metrics(*gradients, "baseline.gradients");
      else
        d.baseline.metrics = read_case_metrics(need(*baseline, "metrics", "baseline"), "baseline.metrics");
    }
    if (const json* peer = find(j, "peer")) {
      object(*peer, "peer");
      PeerRecord p;
      p.name = need_text(*peer, "name", "peer");
      p.version = optional_text(*peer, "version", "peer");
      if (const json* gradients = find(*peer, "gradients")) {
        p.gradients = read_gradient_metrics(*gradients, "peer.gradients");
        p.gradient_max_ratio = optional_real(*peer, "gradient_max_ratio", "peer").value_or(0.0);
        p.gradient_rmse_ratio = optional_real(*peer, "gradient_rmse_ratio", "peer").value_or(0.0);
      } else {
        p.metrics = read_case_metrics(need(*peer, "metrics", "peer"), "peer.metrics");
      }
      p.o_max_ratio = optional_real(*peer, "o_max_ratio", "peer").value_or(0.0);
      p.o_rmse_ratio = optional_real(*peer, "o_rmse_ratio", "peer").value_or(0.0);
      d.peer = std::move(p);
    }
    if (const json* condition = find(j, "logit_condition")) d.logit_condition = read_condition(*condition, "logit_condition");
    check_edges(j);
    r.judged = std::move(d);
  }
  r.case_key = optional_text(j, "case", "");
  r.check = optional_text(j, "check", "");
  r.worst_ratio = optional_real(j, "worst_ratio", "");
  if (const json* sweep = find(j, "sweep")) {
    object(*sweep, "sweep");
    SweepOrigin origin;
    origin.seed = unsigned_integer(need(*sweep, "seed", "sweep"), "sweep.seed");
    origin.shard = optional_small_integer(*sweep, "shard", "sweep");
    origin.shards = optional_small_integer(*sweep, "shards", "sweep");
    origin.sanitize = optional_text(*sweep, "sanitize", "sweep");
    r.sweep = origin;
  }
  r.shrunk_problem = optional_text(j, "shrunk_problem", "");
  if (const json* s = find(j, "sanitizer")) {
    object(*s, "sanitizer");
    SanitizerRun run;
    run.tool = need_text(*s, "tool", "sanitizer");
    run.exit_code = small_integer(need(*s, "exit_code", "sanitizer"), "sanitizer.exit_code");
    run.log = optional_text(*s, "log", "sanitizer");
    if (const json* report = find(*s, "report")) {
      if (!report->is_array()) wrong("sanitizer.report", "not an array");
      for (std::size_t i = 0; i < report->size(); ++i)
        run.report.push_back(text((*report)[i], fmt::format("sanitizer.report[{}]", i)));
    }
    r.sanitizer = std::move(run);
  }
}

void from_json(const json& j, BenchRecord& r) {
  object(j, "");
  r = BenchRecord{};
  r.schema = read_schema(j);
  r.time = optional_integer(j, "time", "");
  r.subject = need_text(j, "subject", "");
  r.problem = need_text(j, "problem", "");
  if (const json* peer = find(j, "peer")) r.peer = boolean(*peer, "peer");
  if (const json* d = find(j, "dtype")) r.dtype = dtype(*d, "dtype");
  r.bound = optional_text(j, "bound", "");
  r.median_ms = need_real(j, "median_ms", "");
  r.min_ms = need_real(j, "min_ms", "");
  r.max_ms = need_real(j, "max_ms", "");
  if (const json* samples = find(j, "samples_ms")) {
    if (!samples->is_array()) wrong("samples_ms", "not an array");
    for (std::size_t i = 0; i < samples->size(); ++i)
      r.samples_ms.push_back(real((*samples)[i], fmt::format("samples_ms[{}]", i)));
  }
  for (auto [key, field] : {std::pair{"flops", &r.flops}, {"tflops", &r.tflops}, {"fraction_of_gemm", &r.fraction_of_gemm},
                            {"bytes", &r.bytes}, {"gbps", &r.gbps}, {"fraction_of_copy", &r.fraction_of_copy},
                            {"fraction_of_read", &r.fraction_of_read}})
    *field = optional_real(j, key, "");
  r.warmup = optional_small_integer(j, "warmup", "");
  r.repeats = optional_small_integer(j, "repeats", "");
  r.input_sets = optional_small_integer(j, "input_sets", "");
  r.device = optional_text(j, "device", "");
  r.speed_vs_peer = optional_real(j, "speed_vs_peer", "");
  r.peer_subject = optional_text(j, "peer_subject", "");
  if (!r.speed_vs_peer) {  // before the peer was injected, it was cuDNN
    r.speed_vs_peer = optional_real(j, "speed_vs_cudnn", "");
    if (r.speed_vs_peer && r.peer_subject.empty()) r.peer_subject = "cudnn";
  }
}

void from_json(const json& j, CeilingRecord& r) {
  object(j, "");
  r = CeilingRecord{};
  r.schema = read_schema(j);
  r.time = optional_integer(j, "time", "");
  r.device = need_text(j, "device", "");
  r.gemm_bf16_tflops = need_real(j, "gemm_bf16_tflops", "");
  r.gemm_f32_tflops = need_real(j, "gemm_f32_tflops", "");
  r.copy_gbps = need_real(j, "copy_gbps", "");
  r.read_gbps = optional_real(j, "read_gbps", "");
  r.l2_bytes = optional_real(j, "l2_bytes", "");
  r.method = optional_text(j, "method", "");
}

Record read_record(const json& j) {
  object(j, "");
  const json* kind = find(j, "kind");
  const std::string k = kind ? text(*kind, "kind") : std::string("case");
  if (k == "bench") return j.get<BenchRecord>();
  if (k == "ceiling") return j.get<CeilingRecord>();
  if (k == "case") return j.get<CaseRecord>();
  wrong("kind", fmt::format("unknown kind '{}'", k.substr(0, 80)));
}

Record parse_record(std::string_view line) {
  const json j = json::parse(line.begin(), line.end(), nullptr, false);
  if (j.is_discarded()) throw RecordError("not JSON");
  return read_record(j);
}

// ---- the file ---------------------------------------------------------------------------------

RecordWriter::RecordWriter(const std::string& path) : path_(path) {
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  stream_.open(path, std::ios::app);
  if (!stream_) throw std::runtime_error(fmt::format("cannot open record file '{}' for appending", path));
}

void RecordWriter::write(const Record& record) {
  stream_ << dump_record(record) << '\n';
  stream_.flush();
  if (!stream_) throw std::runtime_error(fmt::format("writing to record file '{}' failed", path_));
}

}  // namespace flashcheck
