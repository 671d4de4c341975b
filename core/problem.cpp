#include "flashcheck/core/problem.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>

namespace flashcheck {
namespace {

struct FamilyInfo {
  ValueFamily family;
  std::string_view name;
  std::vector<double> defaults;
};

const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> table = {
      {ValueFamily::normal, "normal", {0.5, 1.0}},
      {ValueFamily::uniform, "uniform", {-1.0, 1.0}},
      {ValueFamily::heavy, "heavy", {3.0}},
      {ValueFamily::outliers, "outliers", {0.001, 100.0}},
      {ValueFamily::sparse_int, "sparse_int", {3.0, 0.25}},
      {ValueFamily::near_overflow, "near_overflow", {1000.0, 0.5}},
      {ValueFamily::subnormal, "subnormal", {}},
      {ValueFamily::ties, "ties", {4.0}},
      {ValueFamily::dominant, "dominant", {30.0}},
      {ValueFamily::late_max, "late_max", {64.0, 8.0}},
      {ValueFamily::nan_inf, "nan_inf", {0.001}},
      {ValueFamily::offset, "offset", {-60000.0}},
  };
  return table;
}

const FamilyInfo& info(ValueFamily family) {
  for (const auto& entry : families())
    if (entry.family == family) return entry;
  return families().front();
}

// A number read whole, or why not: a number too large for its type is out of
// range (never clamped or wrapped), anything else malformed.
enum class NumberError { none, malformed, out_of_range };

constexpr double kBytesPerGiB = 1024.0 * 1024.0 * 1024.0;

// The largest magnitude of a value parameter that becomes an integer.
constexpr double kMaxIntegerParam = 9007199254740992.0;  // 2^53

// The one parameter of a family that the generator converts to an integer.
struct IntegerParam {
  std::size_t index;
  std::string_view name;
};
std::optional<IntegerParam> integer_param(ValueFamily family) {
  switch (family) {
    case ValueFamily::sparse_int: return IntegerParam{0, "max"};
    case ValueFamily::ties: return IntegerParam{0, "distinct"};
    case ValueFamily::late_max: return IntegerParam{0, "tile"};
    default: return std::nullopt;
  }
}

// A value distribution's parameters: their count, finite, and the integer one
// within the integers a double holds (`field` names it in the error).
void validate_dist(const std::string& field, const ValueDist& dist) {
  if (dist.params.size() != default_params(dist.family).size())
    throw BadInput(field, fmt::format("{} takes {} parameter(s)", to_string(dist.family),
                                      default_params(dist.family).size()));
  for (double param : dist.params)
    if (!std::isfinite(param)) throw BadInput(field, "parameters must be finite");
  // Parameters that the generator turns into integers (a count, a magnitude, a
  // tile) must be integers a double holds exactly: past 2^53 the conversion
  // (and sparse_int's draw modulo 2 max) would leave the 64-bit range.
  if (const auto integer = integer_param(dist.family)) {
    const double value = dist.params[integer->index];
    if (std::fabs(value) > kMaxIntegerParam)
      throw BadInput(field, fmt::format("{}'s {} {} is beyond the integers a double holds exactly (|{}| <= 2^53)",
                                        to_string(dist.family), integer->name, value, integer->name));
  }
}

template <typename T>
NumberError parse_number(std::string_view text, T& value) {
  if (text.empty()) return NumberError::malformed;
  const char* first = text.data();
  if constexpr (std::is_integral_v<T>) {
    if (*first == '+') ++first;
  }
  const char* last = text.data() + text.size();
  auto [end, error] = std::from_chars(first, last, value);
  if (end != last) return NumberError::malformed;
  if (error == std::errc::result_out_of_range) return NumberError::out_of_range;
  return error == std::errc() ? NumberError::none : NumberError::malformed;
}

// Bytes in the largest unit that keeps the number at least 1 (B, KiB, ... TiB).
std::string format_bytes(double bytes) {
  static constexpr std::string_view units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t unit = 0;
  while (unit + 1 < std::size(units) && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[unit]);
}

// 'text', quoted for a message.
std::string quoted(std::string_view text) { return fmt::format("'{}'", printable_excerpt(text)); }

std::int64_t parse_int(std::string_view field, std::string_view text) {
  std::int64_t value = 0;
  switch (parse_number(text, value)) {
    case NumberError::none: return value;
    case NumberError::out_of_range:
      throw BadInput(std::string(field), fmt::format("{} is outside the 64-bit integer range", quoted(text)));
    case NumberError::malformed: break;
  }
  throw BadInput(std::string(field), fmt::format("{} is not an integer", quoted(text)));
}

std::uint64_t parse_seed(std::string_view field, std::string_view text) {
  std::uint64_t value = 0;
  switch (parse_number(text, value)) {
    case NumberError::none: return value;
    case NumberError::out_of_range:
      throw BadInput(std::string(field), fmt::format("{} is above the 64-bit seed range (at most {})", quoted(text),
                                                     std::numeric_limits<std::uint64_t>::max()));
    case NumberError::malformed: break;
  }
  throw BadInput(std::string(field), fmt::format("{} is not a non-negative integer", quoted(text)));
}

double parse_real(std::string_view field, std::string_view text) {
  double value = 0;
  switch (parse_number(text, value)) {
    case NumberError::none: return value;
    case NumberError::out_of_range:
      throw BadInput(std::string(field), fmt::format("{} is outside the range of a double", quoted(text)));
    case NumberError::malformed: break;
  }
  throw BadInput(std::string(field), fmt::format("{} is not a number", quoted(text)));
}

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return parts;
}

std::vector<std::int64_t> parse_int_list(std::string_view field, std::string_view text) {
  std::vector<std::int64_t> values;
  for (auto part : split(text, ',')) values.push_back(parse_int(field, part));
  return values;
}

ValueDist parse_values(std::string_view text, const std::string& field = "values") {
  const auto open = text.find('(');
  const std::string_view name = text.substr(0, open);
  auto family = parse_value_family(name);
  if (!family) {
    std::vector<std::string_view> names;
    for (const auto& entry : families()) names.push_back(entry.name);
    throw BadInput(field, fmt::format("unknown value distribution {} (known: {})", quoted(name), fmt::join(names, ", ")));
  }
  ValueDist dist{*family, default_params(*family)};
  if (open == std::string_view::npos) return dist;
  if (text.back() != ')')
    throw BadInput(field, fmt::format("{} is missing its closing parenthesis", quoted(text)));
  const std::string_view inside = text.substr(open + 1, text.size() - open - 2);
  std::vector<double> params;
  if (!inside.empty())
    for (auto part : split(inside, ',')) params.push_back(parse_real(field, part));
  if (params.size() != dist.params.size())
    throw BadInput(field, fmt::format("{} takes {} parameter(s), got {}", name, dist.params.size(), params.size()));
  for (double p : params)
    if (!std::isfinite(p)) throw BadInput(field, "parameters must be finite");
  dist.params = std::move(params);
  return dist;
}

std::string format_list(const std::vector<std::int64_t>& values) { return fmt::format("{}", fmt::join(values, ",")); }

}  // namespace

std::string_view to_string(ValueFamily family) { return info(family).name; }

std::optional<ValueFamily> parse_value_family(std::string_view text) {
  for (const auto& entry : families())
    if (entry.name == text) return entry.family;
  return std::nullopt;
}

std::vector<double> default_params(ValueFamily family) { return info(family).defaults; }

std::string to_string(const ValueDist& dist) {
  return fmt::format("{}({})", to_string(dist.family), fmt::join(dist.params, ","));
}

std::string_view to_string(Pass pass) { return pass == Pass::fwd ? "fwd" : "bwd"; }

std::string_view to_string(Layout layout) { return layout == Layout::bhsd ? "bhsd" : "bshd"; }

std::string_view to_string(MaskKind mask) {
  switch (mask) {
    case MaskKind::none: return "none";
    case MaskKind::causal_tl: return "causal_tl";
    case MaskKind::causal_br: return "causal_br";
    case MaskKind::window: return "window";
  }
  return "?";
}

VisibleKeys visible_key_range(const Problem& p, std::int64_t b, std::int64_t i) {
  const std::int64_t lq = p.len_q(b), lk = p.len_kv(b);
  const std::int64_t diagonal = i + lk - lq;
  VisibleKeys range{0, lk - 1};
  if (p.mask == MaskKind::causal_tl) range.last = std::min(range.last, i);
  if (p.mask == MaskKind::causal_br) range.last = std::min(range.last, diagonal);
  if (p.mask == MaskKind::window) {
    if (p.window_left >= 0) range.first = std::max(range.first, diagonal - p.window_left);
    if (p.window_right >= 0) range.last = std::min(range.last, diagonal + p.window_right);
  }
  return range;
}

double visible_pairs(const Problem& p) {
  double pairs = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i) pairs += static_cast<double>(visible_key_range(p, b, i).count());
  return pairs * static_cast<double>(p.heads_q);
}

std::int64_t visible_rows(const Problem& p) {
  std::int64_t rows = 0;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t i = 0; i < p.len_q(b); ++i) rows += visible_key_range(p, b, i).count() > 0;
  return rows * p.heads_q;
}

double attention_flops(const Problem& p) {
  const double forward = 2.0 * static_cast<double>(p.head_dim + p.head_dim_v) * visible_pairs(p);
  return p.pass == Pass::bwd ? kBackwardFlopsFactor * forward : forward;
}

double attention_bytes(const Problem& p) {
  if (p.pass == Pass::fwd) return p.storage_bytes();
  const double lse = static_cast<double>(p.batch) * p.heads_q * p.seqlen_q * 4.0;
  return 2 * (p.storage_bytes() - lse) + lse;  // Q, K, V, O and their gradients (dO for O), LSE once
}

double alibi_slope(std::int64_t heads, std::int64_t h) {
  std::int64_t m = 1;
  while (m * 2 <= heads) m *= 2;
  const double exponent = h < m ? -8.0 * static_cast<double>(h + 1) / static_cast<double>(m)
                                : -4.0 * static_cast<double>(2 * (h - m) + 1) / static_cast<double>(m);
  return std::exp2(exponent);
}

double default_softmax_scale(std::int64_t head_dim) {
  return head_dim > 0 ? 1.0 / std::sqrt(static_cast<double>(head_dim)) : 1.0;
}

Problem make_problem(std::int64_t batch, std::int64_t heads_q, std::int64_t heads_kv, std::int64_t seqlen_q,
                     std::int64_t seqlen_kv, std::int64_t head_dim, DType dtype, MaskKind mask) {
  Problem p;
  p.batch = batch;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seqlen_q = seqlen_q;
  p.seqlen_kv = seqlen_kv;
  p.head_dim = head_dim;
  p.head_dim_v = head_dim;
  p.dtype = dtype;
  p.mask = mask;
  p.softmax_scale = default_softmax_scale(head_dim);
  return p;
}

double Problem::storage_bytes() const {
  const double element = flashcheck::storage_bytes(dtype);
  const double output = flashcheck::storage_bytes(output_dtype(dtype));  // O: bf16 for fp8 inputs
  const double rows = static_cast<double>(batch) * static_cast<double>(heads_q) * static_cast<double>(seqlen_q);
  const double inputs = rows * static_cast<double>(head_dim) +
                        static_cast<double>(batch) * heads_kv * seqlen_kv * static_cast<double>(head_dim + head_dim_v);
  return inputs * element + rows * static_cast<double>(head_dim_v) * output + rows * 4.0;
}

BadInput::BadInput(std::string field, const std::string& reason, std::string location)
    : std::runtime_error(location.empty() ? fmt::format("bad problem: {}: {}", field, reason)
                                          : fmt::format("{}: bad problem: {}: {}", location, field, reason)),
      field_(std::move(field)),
      reason_(reason),
      location_(std::move(location)) {}

std::string printable_excerpt(std::string_view text) {
  std::string excerpt;
  std::size_t taken = 0;
  for (; taken < text.size(); ++taken) {
    const auto byte = static_cast<unsigned char>(text[taken]);
    const bool printable = byte >= 0x20 && byte < 0x7f;
    const std::size_t width = printable ? 1 : 4;  // \xNN
    if (excerpt.size() + width > kMaxQuotedChars) break;
    if (printable) excerpt += static_cast<char>(byte);
    else excerpt += fmt::format("\\x{:02x}", byte);
  }
  if (taken < text.size()) excerpt += fmt::format("... ({} more bytes)", text.size() - taken);
  return excerpt;
}

std::string to_line(const Problem& p) {
  std::string line = fmt::format("b={} hq={} hkv={} sq={} skv={}", p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_kv);
  if (!p.lens_q.empty()) line += fmt::format(" lens_q={}", format_list(p.lens_q));
  if (!p.lens_kv.empty()) line += fmt::format(" lens_kv={}", format_list(p.lens_kv));
  line += fmt::format(" d={} dv={} dtype={} layout={} mask={}", p.head_dim, p.head_dim_v, to_string(p.dtype),
                      to_string(p.layout), to_string(p.mask));
  if (p.mask == MaskKind::window) line += fmt::format(" window={},{}", p.window_left, p.window_right);
  line += fmt::format(" scale={}", p.softmax_scale);
  if (p.softcap > 0) line += fmt::format(" softcap={}", p.softcap);
  if (p.alibi) line += " alibi=yes";
  if (p.page_size > 0) line += fmt::format(" page={}", p.page_size);
  line += fmt::format(" values={}", to_string(p.values));
  if (p.pass == Pass::bwd) line += fmt::format(" pass=bwd dout={}", to_string(p.dout));
  line += fmt::format(" gseed={} dseed={}", p.geometry_seed, p.data_seed);
  return line;
}

Problem parse_problem(std::string_view line) {
  std::map<std::string, std::string_view, std::less<>> fields;
  static const std::set<std::string_view> known = {"b", "hq", "hkv", "sq", "skv", "lens_q", "lens_kv", "d", "dv",
                                                   "dtype", "layout", "mask", "window", "scale", "softcap", "alibi", "page",
                                                   "values", "pass", "dout", "gseed", "dseed"};
  std::size_t position = 0;
  while (position < line.size()) {
    while (position < line.size() && std::isspace(static_cast<unsigned char>(line[position]))) ++position;
    if (position >= line.size()) break;
    std::size_t end = position;
    while (end < line.size() && !std::isspace(static_cast<unsigned char>(line[end]))) ++end;
    const std::string_view token = line.substr(position, end - position);
    position = end;
    const auto equals = token.find('=');
    if (equals == std::string_view::npos) throw BadInput(printable_excerpt(token), "expected key=value");
    const std::string key(token.substr(0, equals));
    if (key.empty()) throw BadInput("line", fmt::format("{} has no key before '='", quoted(token)));
    if (!known.count(key)) throw BadInput(printable_excerpt(key), "unknown field");
    if (fields.count(key)) throw BadInput(key, "given twice");
    const std::string_view value = token.substr(equals + 1);
    if (value.empty()) throw BadInput(key, "has no value");
    fields[key] = value;
  }
  for (std::string_view required : {"b", "hq", "sq", "skv", "d", "dtype"})
    if (!fields.count(required)) throw BadInput(std::string(required), "missing (the line may be truncated)");

  Problem p;
  p.batch = parse_int("b", fields["b"]);
  p.heads_q = parse_int("hq", fields["hq"]);
  p.heads_kv = fields.count("hkv") ? parse_int("hkv", fields["hkv"]) : p.heads_q;
  p.seqlen_q = parse_int("sq", fields["sq"]);
  p.seqlen_kv = parse_int("skv", fields["skv"]);
  if (fields.count("lens_q")) p.lens_q = parse_int_list("lens_q", fields["lens_q"]);
  if (fields.count("lens_kv")) p.lens_kv = parse_int_list("lens_kv", fields["lens_kv"]);
  p.head_dim = parse_int("d", fields["d"]);
  p.head_dim_v = fields.count("dv") ? parse_int("dv", fields["dv"]) : p.head_dim;
  auto dtype = parse_dtype(fields["dtype"]);
  if (!dtype) throw BadInput("dtype", fmt::format("unknown dtype {} (known: f32, f16, bf16, e4m3, e5m2)", quoted(fields["dtype"])));
  p.dtype = *dtype;
  if (fields.count("layout")) {
    const auto text = fields["layout"];
    if (text == "bhsd") p.layout = Layout::bhsd;
    else if (text == "bshd") p.layout = Layout::bshd;
    else throw BadInput("layout", fmt::format("unknown layout {} (known: bhsd, bshd)", quoted(text)));
  }
  if (fields.count("mask")) {
    const auto text = fields["mask"];
    bool found = false;
    for (MaskKind kind : {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window})
      if (to_string(kind) == text) {
        p.mask = kind;
        found = true;
      }
    if (!found)
      throw BadInput("mask", fmt::format("unknown mask {} (known: none, causal_tl, causal_br, window)", quoted(text)));
  }
  if (fields.count("window")) {
    if (p.mask != MaskKind::window)
      throw BadInput("window", fmt::format("a window is only valid with mask=window, not mask={}", to_string(p.mask)));
    const auto bounds = parse_int_list("window", fields["window"]);
    if (bounds.size() != 2) throw BadInput("window", "expected two bounds: window=LEFT,RIGHT");
    p.window_left = bounds[0];
    p.window_right = bounds[1];
  } else if (p.mask == MaskKind::window) {
    throw BadInput("window", "mask=window needs window=LEFT,RIGHT");
  }
  p.softmax_scale = fields.count("scale") ? parse_real("scale", fields["scale"]) : default_softmax_scale(p.head_dim);
  if (fields.count("softcap")) {
    p.softcap = parse_real("softcap", fields["softcap"]);
    if (!(p.softcap > 0)) throw BadInput("softcap", fmt::format("{} must be positive (leave it out for none)", p.softcap));
  }
  if (fields.count("alibi")) {
    const auto text = fields["alibi"];
    if (text == "yes") p.alibi = true;
    else if (text == "no") p.alibi = false;
    else throw BadInput("alibi", fmt::format("unknown value {} (known: yes, no)", quoted(text)));
  }
  if (fields.count("page")) {
    p.page_size = parse_int("page", fields["page"]);
    if (p.page_size < 1) throw BadInput("page", fmt::format("{} must be >= 1 keys a page (leave it out for contiguous K/V)", p.page_size));
  }
  if (fields.count("values")) p.values = parse_values(fields["values"]);
  if (fields.count("pass")) {
    const auto text = fields["pass"];
    if (text == "fwd") p.pass = Pass::fwd;
    else if (text == "bwd") p.pass = Pass::bwd;
    else throw BadInput("pass", fmt::format("unknown pass {} (known: fwd, bwd)", quoted(text)));
  }
  if (fields.count("dout")) {
    if (p.pass != Pass::bwd) throw BadInput("dout", "dO is drawn for pass=bwd only");
    p.dout = parse_values(fields["dout"], "dout");
  }
  if (fields.count("gseed")) p.geometry_seed = parse_seed("gseed", fields["gseed"]);
  if (fields.count("dseed")) p.data_seed = parse_seed("dseed", fields["dseed"]);
  validate(p);
  return p;
}

void validate(const Problem& p) {
  // Each dimension stays below 2^31 so that every index fits an int64 product.
  constexpr std::int64_t kMaxDimension = std::int64_t{1} << 31;
  auto check_size = [&](std::string_view field, std::int64_t value, std::int64_t minimum) {
    if (value < minimum)
      throw BadInput(std::string(field), fmt::format("{} must be >= {}", value, minimum));
    if (value >= kMaxDimension) throw BadInput(std::string(field), fmt::format("{} is too large", value));
  };
  check_size("b", p.batch, 1);
  check_size("hq", p.heads_q, 1);
  check_size("hkv", p.heads_kv, 1);
  check_size("sq", p.seqlen_q, 0);
  check_size("skv", p.seqlen_kv, 0);
  check_size("d", p.head_dim, 1);
  check_size("dv", p.head_dim_v, 1);
  if (p.heads_q % p.heads_kv != 0)
    throw BadInput("hkv", fmt::format("heads_q={} is not a multiple of heads_kv={}", p.heads_q, p.heads_kv));
  auto check_lens = [&](std::string_view field, const std::vector<std::int64_t>& lens, std::int64_t padded) {
    if (lens.empty()) return;
    if (static_cast<std::int64_t>(lens.size()) != p.batch)
      throw BadInput(std::string(field), fmt::format("has {} lengths for a batch of {}", lens.size(), p.batch));
    for (std::int64_t len : lens)
      if (len < 0 || len > padded)
        throw BadInput(std::string(field), fmt::format("length {} is outside [0, {}]", len, padded));
  };
  check_lens("lens_q", p.lens_q, p.seqlen_q);
  check_lens("lens_kv", p.lens_kv, p.seqlen_kv);
  if (p.mask != MaskKind::window && (p.window_left != -1 || p.window_right != -1))
    throw BadInput("window", fmt::format("a window is only valid with mask=window, not mask={}", to_string(p.mask)));
  if (p.mask == MaskKind::window && (p.window_left < -1 || p.window_right < -1))
    throw BadInput("window", "bounds must be >= 0, or -1 for unbounded");
  // A bound past every sequence means the same as unbounded; past 2^31 it
  // could overflow the index arithmetic of the mask.
  if (p.window_left >= kMaxDimension || p.window_right >= kMaxDimension)
    throw BadInput("window", fmt::format("{},{}: a bound must be below 2^31 (-1 for unbounded)", p.window_left,
                                         p.window_right));
  if (!std::isfinite(p.softmax_scale) || p.softmax_scale <= 0)
    throw BadInput("scale", fmt::format("{} must be a positive finite number", p.softmax_scale));
  if (!std::isfinite(p.softcap) || p.softcap < 0)
    throw BadInput("softcap", fmt::format("{} must be a positive finite number (0: none)", p.softcap));
  if (p.page_size < 0 || p.page_size >= kMaxDimension)
    throw BadInput("page", fmt::format("{} must be >= 1 keys a page, or 0 for contiguous K/V", p.page_size));
  if (p.page_size > 0 && p.pass == Pass::bwd)
    throw BadInput("page", "a paged K/V cache is the forward's (serving); pass=bwd takes contiguous K/V");
  if (is_fp8(p.dtype) && p.pass == Pass::bwd)
    throw BadInput("dtype", fmt::format("{} is the forward's (serving); pass=bwd takes f32, f16 or bf16", to_string(p.dtype)));
  validate_dist("values", p.values);
  if (p.pass == Pass::bwd) validate_dist("dout", p.dout);
  else if (p.dout != Problem{}.dout) throw BadInput("dout", "dO is drawn for pass=bwd only");
  const double needed = estimated_memory_bytes(p);
  const double limit = memory_limit_bytes();
  if (limit > 0 && needed > limit)
    throw BadInput("size", fmt::format("the problem needs about {} of memory, above the limit of {} "
                                       "(--max-memory GIB changes it)",
                                       format_bytes(needed), format_bytes(limit)));
}

double estimated_memory_bytes(const Problem& p) {
  const double element = flashcheck::storage_bytes(p.dtype);
  const double rows = static_cast<double>(p.batch) * static_cast<double>(p.heads_q) * static_cast<double>(p.seqlen_q);
  const double keys = static_cast<double>(p.batch) * static_cast<double>(p.heads_kv) * static_cast<double>(p.seqlen_kv);
  const double d = static_cast<double>(p.head_dim), dv = static_cast<double>(p.head_dim_v);
  const double inputs = (rows * d + keys * (d + dv)) * element;
  const double outputs = 2.0 * rows * (dv * flashcheck::storage_bytes(output_dtype(p.dtype)) + 4.0);  // subject and peer: O stored, LSE f32
  // The judge compares every row up to 1024 per sequence, else a sample of
  // 1024 (JudgeOptions::max_rows' default, oracles/judge.hpp).
  constexpr double kComparedRowsPerSequence = 1024;
  const double compared_rows = static_cast<double>(p.batch) * static_cast<double>(p.heads_q) *
                               std::min(static_cast<double>(p.seqlen_q), kComparedRowsPerSequence);
  // O and LSE rows in f64: the reference and its condition numbers, the
  // baseline's rows, the subject's and the peer's gathered rows.
  const double reference_rows = 5.0 * compared_rows * (dv + 1.0) * 8.0;
  if (p.pass == Pass::fwd) return inputs + outputs + reference_rows;
  // Backward: dO, the O and LSE handed to the subject, dQ/dK/dV of the subject
  // and the peer as stored, and in f64 the gradient rows (the reference and
  // the baseline's, the subject's and the peer's gathered rows: four sets of
  // the compared query rows and up to 1024 key rows per sequence).
  const double compared_keys = static_cast<double>(p.batch) * static_cast<double>(p.heads_kv) *
                               std::min(static_cast<double>(p.seqlen_kv), kComparedRowsPerSequence);
  const double backward = rows * dv * element * 2.0 + rows * 4.0 + 2.0 * (rows * d + keys * (d + dv)) * element +
                          4.0 * (compared_rows * d + compared_keys * (d + dv)) * 8.0;
  return inputs + outputs + reference_rows + backward;
}

double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_bytes = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_bytes <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page_bytes);
}

namespace {
std::optional<double> memory_limit_set;  // by set_memory_limit_bytes
}  // namespace

double memory_limit_bytes() {
  if (memory_limit_set) return *memory_limit_set;
  if (const char* text = std::getenv("FLASHCHECK_MAX_MEMORY"); text && *text) {
    double gib = 0;
    if (parse_number(std::string_view(text), gib) != NumberError::none || !std::isfinite(gib) || gib <= 0)
      throw BadInput("max-memory", fmt::format("FLASHCHECK_MAX_MEMORY={} is not a positive number of GiB",
                                               quoted(text)));
    return gib * kBytesPerGiB;
  }
  return physical_memory_bytes() / 2;
}

void set_memory_limit_bytes(double bytes) {
  if (!std::isfinite(bytes) || bytes <= 0)
    throw BadInput("max-memory", fmt::format("{} bytes is not a positive finite limit", bytes));
  memory_limit_set = bytes;
}

void clear_memory_limit() { memory_limit_set.reset(); }

}  // namespace flashcheck
