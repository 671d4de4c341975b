// The worker client's helpers (client.hpp).
#include "flashcheck/external/client.hpp"

#include <fstream>

namespace flashcheck::external {

/// The .npy type string of a storage dtype: bf16 travels as its bit pattern
/// ('<u2'), as NumPy has no bfloat16.
std::string npy_descr(DType dtype) { return dtype == DType::f32 ? "<f4" : dtype == DType::f16 ? "<f2" : "<u2"; }

/// A tensor's shape in storage order: [B, H, S, D] (bhsd) or [B, S, H, D] (bshd).
std::vector<std::int64_t> storage_shape(const HostTensor& t) {
  return t.layout() == Layout::bhsd ? std::vector<std::int64_t>{t.batch(), t.heads(), t.seqlen(), t.dim()}
                                    : std::vector<std::int64_t>{t.batch(), t.seqlen(), t.heads(), t.dim()};
}

/// A reply's string field, or `otherwise` when it is missing or not a string
/// (a worker's reply is untrusted: a null or a number there must not throw).
std::string text_of(const nlohmann::json& reply, const char* key, const std::string& otherwise) {
  const auto found = reply.find(key);
  return found != reply.end() && found->is_string() ? found->get<std::string>() : otherwise;
}

std::string log_tail(const fs::path& log) {
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  std::string tail;
  for (std::size_t i = lines.size() > 3 ? lines.size() - 3 : 0; i < lines.size(); ++i)
    tail += (tail.empty() ? "" : " | ") + lines[i].substr(0, 300);
  return tail.empty() ? std::string() : fmt::format("; its stderr ends: {}", tail);
}

}  // namespace flashcheck::external
