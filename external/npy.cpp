#include "flashcheck/external/npy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>

namespace flashcheck::external {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicBytes = 6;

/// The text after `'key':` in a header dict, up to the next top-level comma.
std::string header_value(const std::string& header, const std::string& key, const std::filesystem::path& path) {
  const std::size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) throw std::runtime_error(fmt::format("{}: .npy header has no '{}'", path.string(), key));
  std::size_t start = header.find(':', at);
  if (start == std::string::npos) throw std::runtime_error(fmt::format("{}: malformed .npy header", path.string()));
  ++start;
  while (start < header.size() && header[start] == ' ') ++start;
  std::size_t end = start;
  if (header[start] == '(') {
    end = header.find(')', start);
    if (end == std::string::npos) throw std::runtime_error(fmt::format("{}: malformed .npy shape", path.string()));
    return header.substr(start, end + 1 - start);
  }
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(start, end - start);
}

std::vector<std::int64_t> parse_shape(const std::string& text, const std::filesystem::path& path) {
  std::vector<std::int64_t> shape;
  std::size_t i = 1;  // after '('
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i >= text.size() || text[i] == ')') break;
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(text.substr(i), &used);
    } catch (const std::exception&) {
      throw std::runtime_error(fmt::format("{}: malformed .npy shape {}", path.string(), text));
    }
    if (value < 0) throw std::runtime_error(fmt::format("{}: negative .npy dimension in {}", path.string(), text));
    shape.push_back(value);
    i += used;
  }
  return shape;
}

std::size_t item_bytes(const std::string& descr) {
  if (descr.size() < 3 || (descr[0] != '<' && descr[0] != '|' && descr[0] != '=')) return 0;
  try {
    return std::stoul(descr.substr(2));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

std::int64_t NpyArray::elements() const {
  std::int64_t n = 1;
  for (std::int64_t extent : shape) n *= extent;
  return n;
}

std::string shape_text(const std::vector<std::int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

void write_npy(const std::filesystem::path& path, const std::string& descr, const std::vector<std::int64_t>& shape,
               const void* data, std::size_t bytes) {
  std::string dims;
  for (std::int64_t extent : shape) dims += fmt::format("{}, ", extent);
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (n,) keeps its comma
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, dims);
  // Magic (6) + version (2) + length (2) + header + '\n', padded to 64 bytes.
  const std::size_t total = kMagicBytes + 4 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::uint16_t length = static_cast<std::uint16_t>(header.size());
  const char version[2] = {1, 0};
  out.write(kMagic, kMagicBytes);
  out.write(version, 2);
  out.write(reinterpret_cast<const char*>(&length), 2);  // little-endian hosts only (x86-64, aarch64)
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", path.string()));
}

NpyArray read_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: no such file (the worker did not write it)", path.string()));
  char magic[kMagicBytes + 2] = {};
  in.read(magic, sizeof magic);
  if (!in || std::memcmp(magic, kMagic, kMagicBytes) != 0)
    throw std::runtime_error(fmt::format("{}: not an .npy file", path.string()));
  std::uint32_t length = 0;
  if (magic[kMagicBytes] == 1) {
    std::uint16_t short_length = 0;
    in.read(reinterpret_cast<char*>(&short_length), 2);
    length = short_length;
  } else if (magic[kMagicBytes] == 2 || magic[kMagicBytes] == 3) {
    in.read(reinterpret_cast<char*>(&length), 4);
  } else {
    throw std::runtime_error(fmt::format("{}: .npy version {} is not supported", path.string(), int{magic[kMagicBytes]}));
  }
  if (!in || length > (1u << 20)) throw std::runtime_error(fmt::format("{}: malformed .npy header", path.string()));
  std::string header(length, '\0');
  in.read(header.data(), length);
  if (!in) throw std::runtime_error(fmt::format("{}: truncated .npy header", path.string()));
  NpyArray array;
  std::string descr = header_value(header, "descr", path);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"'))
    throw std::runtime_error(fmt::format("{}: malformed .npy descr {}", path.string(), descr));
  array.descr = descr.substr(1, descr.size() - 2);
  if (header_value(header, "fortran_order", path) != "False")
    throw std::runtime_error(fmt::format("{}: Fortran-order arrays are not accepted (write C order)", path.string()));
  array.shape = parse_shape(header_value(header, "shape", path), path);
  const std::size_t item = item_bytes(array.descr);
  if (item == 0) throw std::runtime_error(fmt::format("{}: unsupported .npy dtype '{}'", path.string(), array.descr));
  // The header is the worker's word: check its size against the file before
  // allocating (a forged shape must not exhaust memory or overflow).
  const auto data_start = static_cast<std::uintmax_t>(in.tellg());
  std::error_code error;
  const std::uintmax_t file_bytes = std::filesystem::file_size(path, error);
  std::uintmax_t want = item;
  for (std::int64_t extent : array.shape) {
    if (extent != 0 && want > std::numeric_limits<std::uintmax_t>::max() / static_cast<std::uintmax_t>(extent))
      throw std::runtime_error(fmt::format("{}: .npy shape {} is too large", path.string(), shape_text(array.shape)));
    want *= static_cast<std::uintmax_t>(extent);
  }
  if (error || file_bytes < data_start || file_bytes - data_start != want)
    throw std::runtime_error(fmt::format("{}: {} data bytes for shape {} of '{}', expected {}", path.string(),
                                         error ? 0 : file_bytes - std::min(file_bytes, data_start),
                                         shape_text(array.shape), array.descr, want));
  array.bytes.resize(static_cast<std::size_t>(want));
  in.read(array.bytes.data(), static_cast<std::streamsize>(want));
  if (static_cast<std::uintmax_t>(in.gcount()) != want)
    throw std::runtime_error(fmt::format("{}: {} data bytes for shape {} of '{}', expected {}", path.string(),
                                         in.gcount(), shape_text(array.shape), array.descr, want));
  return array;
}

}  // namespace flashcheck::external
