// The worker protocol's JSON: Capabilities and problems (protocol.hpp).
#include "flashcheck/external/protocol.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace flashcheck::external {

namespace {

constexpr MaskKind kMasks[] = {MaskKind::none, MaskKind::causal_tl, MaskKind::causal_br, MaskKind::window};
constexpr Layout kLayouts[] = {Layout::bhsd, Layout::bshd};

template <typename Enum, std::size_t N>
nlohmann::json names_of(const EnumSet<Enum>& set, const Enum (&all)[N]) {
  nlohmann::json names = nlohmann::json::array();
  for (Enum value : all)
    if (set.contains(value)) names.push_back(std::string(to_string(value)));
  return names;
}

template <typename Enum, std::size_t N>
EnumSet<Enum> set_of(const nlohmann::json& names, const Enum (&all)[N], std::string_view key) {
  if (!names.is_array()) throw std::runtime_error(fmt::format("capabilities.{}: expected a list of names", key));
  EnumSet<Enum> set;
  for (const auto& name : names) {
    bool found = false;
    for (Enum value : all)
      if (name.is_string() && to_string(value) == name.get<std::string>()) {
        set.insert(value);
        found = true;
      }
    if (!found) {
      std::string known;
      for (Enum value : all) known += fmt::format("{}{}", known.empty() ? "" : ", ", to_string(value));
      throw std::runtime_error(fmt::format("capabilities.{}: unknown name {} (known: {})", key, name.dump(), known));
    }
  }
  return set;
}

}  // namespace

nlohmann::json to_json(const Capabilities& c) {
  nlohmann::json j = {{"dtypes", names_of(c.dtypes, kDTypes)},
                      {"masks", names_of(c.masks, kMasks)},
                      {"layouts", names_of(c.layouts, kLayouts)},
                      {"min_head_dim", c.min_head_dim},
                      {"max_head_dim", c.max_head_dim},
                      {"max_head_dim_v", c.max_head_dim_v},
                      {"head_dim_v_equal", c.head_dim_v_equal},
                      {"gqa", c.gqa},
                      {"varlen", c.varlen},
                      {"softcap", c.softcap},
                      {"alibi", c.alibi},
                      {"min_page_size", c.min_page_size},
                      {"page_size_multiple", c.page_size_multiple},
                      {"page_size_power_of_two", c.page_size_power_of_two},
                      {"lse", c.lse},
                      {"product_accumulation_unit", c.product_accumulation_unit},
                      {"fp8_output", c.fp8_output},
                      {"fp8_accumulator_keys", c.fp8_accumulator_keys},
                      {"seqlen_q_multiple", c.seqlen_q_multiple},
                      {"seqlen_kv_multiple", c.seqlen_kv_multiple},
                      {"max_seqlen_q", c.max_seqlen_q},
                      {"min_seqlen_q", c.min_seqlen_q},
                      {"max_seqlen_kv", c.max_seqlen_kv},
                      {"empty_sequences", c.empty_sequences},
                      {"nonfinite_inputs", c.nonfinite_inputs},
                      {"may_flush_subnormals", c.may_flush_subnormals},
                      {"tile_q", c.tile_q},
                      {"tile_kv", c.tile_kv},
                      {"needs_gpu", c.needs_gpu},
                      {"min_compute_capability", c.min_compute_capability},
                      {"backward", c.backward},
                      {"backward_deterministic", c.backward_deterministic},
                      {"backward_operands_in_dtype", c.backward_operands_in_dtype},
                      {"known_deviations", std::string(c.known_deviations)}};
  if (c.head_dims[0] != 0) {
    j["head_dims"] = nlohmann::json::array();
    for (auto d : c.head_dims)
      if (d != 0) j["head_dims"].push_back(d);
  }
  if (c.compute_dtype) j["compute_dtype"] = std::string(to_string(*c.compute_dtype));
  return j;
}

Capabilities capabilities_from_json(const nlohmann::json& j, std::string& deviations, int protocol) {
  if (!j.is_object()) throw std::runtime_error("capabilities: expected a JSON object");
  for (std::string_view required : {"dtypes", "masks"})
    if (!j.contains(required)) throw std::runtime_error(fmt::format("capabilities.{}: missing (required)", required));
  Capabilities c;
  for (const auto& [key, value] : j.items()) {
    // Each key is read with the type its field has; a wrong type or an
    // unknown key (a typo would otherwise widen or narrow the domain
    // silently) is an error naming it.
    const auto integer = [&](std::int64_t low, std::int64_t high) {
      if (!value.is_number_integer() || value.get<std::int64_t>() < low || value.get<std::int64_t>() > high)
        throw std::runtime_error(fmt::format("capabilities.{}: expected an integer in [{}, {}], got {}", key, low,
                                             high, value.dump()));
      return value.get<std::int64_t>();
    };
    const auto boolean = [&] {
      if (!value.is_boolean())
        throw std::runtime_error(fmt::format("capabilities.{}: expected true or false, got {}", key, value.dump()));
      return value.get<bool>();
    };
    constexpr std::int64_t kBig = std::numeric_limits<std::int32_t>::max();
    if (key == "dtypes") c.dtypes = set_of(value, kDTypes, key);
    else if (key == "masks") c.masks = set_of(value, kMasks, key);
    else if (key == "layouts") c.layouts = set_of(value, kLayouts, key);
    else if (key == "head_dims") {
      if (!value.is_array() || value.empty() || value.size() > c.head_dims.size())
        throw std::runtime_error(
            fmt::format("capabilities.head_dims: expected a list of 1 to {} head dims", c.head_dims.size()));
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (!value[i].is_number_integer() || value[i].get<int>() < 1 || value[i].get<int>() > 1024)
          throw std::runtime_error(fmt::format("capabilities.head_dims: bad head dim {}", value[i].dump()));
        c.head_dims[i] = static_cast<std::int16_t>(value[i].get<int>());
      }
    } else if (key == "min_head_dim") c.min_head_dim = integer(1, 1024);
    else if (key == "max_head_dim") c.max_head_dim = integer(1, 1024);
    else if (key == "max_head_dim_v") c.max_head_dim_v = integer(1, 1024);
    else if (key == "head_dim_v_equal") c.head_dim_v_equal = boolean();
    else if (key == "gqa") c.gqa = boolean();
    else if (key == "varlen") c.varlen = boolean();
    else if (key == "softcap") c.softcap = boolean();
    else if (key == "alibi") c.alibi = boolean();
    else if (key == "min_page_size") c.min_page_size = integer(0, 1 << 20);
    else if (key == "page_size_multiple") c.page_size_multiple = integer(1, 1 << 20);
    else if (key == "page_size_power_of_two") c.page_size_power_of_two = boolean();
    else if (key == "lse") c.lse = boolean();
    else if (key == "fp8_output") c.fp8_output = boolean();
    else if (key == "fp8_accumulator_keys") c.fp8_accumulator_keys = integer(0, kBig);
    else if (key == "product_accumulation_unit") {
      if (!value.is_number() || !(value.get<double>() >= 0 && value.get<double>() < 1))
        throw std::runtime_error(fmt::format("capabilities.product_accumulation_unit: expected a number in [0, 1), got {}",
                                             value.dump()));
      c.product_accumulation_unit = value.get<double>();
    }
    else if (key == "seqlen_q_multiple") c.seqlen_q_multiple = integer(1, 1 << 16);
    else if (key == "seqlen_kv_multiple") c.seqlen_kv_multiple = integer(1, 1 << 16);
    else if (key == "max_seqlen_q") c.max_seqlen_q = integer(1, kBig);
    else if (key == "min_seqlen_q") c.min_seqlen_q = integer(0, kBig);
    else if (key == "max_seqlen_kv") c.max_seqlen_kv = integer(1, kBig);
    else if (key == "empty_sequences") c.empty_sequences = boolean();
    else if (key == "nonfinite_inputs") c.nonfinite_inputs = boolean();
    else if (key == "may_flush_subnormals") c.may_flush_subnormals = boolean();
    else if (key == "tile_q") c.tile_q = integer(1, 1 << 16);
    else if (key == "tile_kv") c.tile_kv = integer(1, 1 << 16);
    else if (key == "needs_gpu") c.needs_gpu = boolean();
    else if (key == "min_compute_capability") c.min_compute_capability = static_cast<int>(integer(0, 1000));
    else if (key == "backward" || key == "backward_deterministic" || key == "backward_operands_in_dtype") {
      // A version-1 worker would be sent backward requests it cannot read.
      if (protocol < 2)
        throw std::runtime_error(fmt::format("capabilities.{}: needs protocol 2 (the worker speaks {})", key, protocol));
      (key == "backward" ? c.backward : key == "backward_deterministic" ? c.backward_deterministic
                                                                          : c.backward_operands_in_dtype) = boolean();
    } else if (key == "compute_dtype") {
      const auto dtype = value.is_string() ? parse_dtype(value.get<std::string>()) : std::nullopt;
      if (!dtype) throw std::runtime_error(fmt::format("capabilities.compute_dtype: unknown dtype {}", value.dump()));
      c.compute_dtype = dtype;
    } else if (key == "known_deviations") {
      if (!value.is_string()) throw std::runtime_error("capabilities.known_deviations: expected a string");
      deviations = value.get<std::string>();
    } else {
      throw std::runtime_error(fmt::format("capabilities: unknown key '{}' (docs/external-subjects.md lists them)", key));
    }
  }
  if (c.dtypes.empty()) throw std::runtime_error("capabilities.dtypes: empty (the worker accepts nothing)");
  for (DType fp8 : {DType::e4m3, DType::e5m2})
    if (c.dtypes.contains(fp8))
      throw std::runtime_error(fmt::format("capabilities.dtypes: {} is not carried by the worker protocol (.npy has no "
                                           "fp8 dtype, and the descales have no key yet)",
                                           to_string(fp8)));
  if (c.masks.empty()) throw std::runtime_error("capabilities.masks: empty (the worker accepts nothing)");
  if (c.layouts.empty()) throw std::runtime_error("capabilities.layouts: empty (the worker accepts nothing)");
  if (c.min_head_dim > c.max_head_dim)
    throw std::runtime_error(fmt::format("capabilities: min_head_dim {} > max_head_dim {}", c.min_head_dim,
                                         c.max_head_dim));
  if (c.backward_deterministic && !c.backward)
    throw std::runtime_error("capabilities: backward_deterministic without backward (a backward it does not have)");
  if (c.backward_operands_in_dtype && !c.backward)
    throw std::runtime_error("capabilities: backward_operands_in_dtype without backward (a backward it does not have)");
  c.known_deviations = deviations;
  return c;
}

nlohmann::json problem_fields(const Problem& p) {
  nlohmann::json j = {{"batch", p.batch},
                      {"heads_q", p.heads_q},
                      {"heads_kv", p.heads_kv},
                      {"seqlen_q", p.seqlen_q},
                      {"seqlen_kv", p.seqlen_kv},
                      {"lens_q", p.lens_q},
                      {"lens_kv", p.lens_kv},
                      {"head_dim", p.head_dim},
                      {"head_dim_v", p.head_dim_v},
                      {"dtype", std::string(to_string(p.dtype))},
                      {"layout", std::string(to_string(p.layout))},
                      {"mask", std::string(to_string(p.mask))},
                      {"window_left", p.window_left},
                      {"window_right", p.window_right},
                      {"softmax_scale", p.softmax_scale},
                      {"softcap", p.softcap},
                      {"alibi", p.alibi},
                      {"page_size", p.page_size}};
  if (p.lens_q.empty()) j["lens_q"] = nullptr;
  if (p.lens_kv.empty()) j["lens_kv"] = nullptr;
  return j;
}

}  // namespace flashcheck::external
