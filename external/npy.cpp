#include "flashcheck/external/npy.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

namespace {

/// A worker's file, opened without blocking (a FIFO is refused, not waited
/// on) and read under a deadline.
class OutputFile {
 public:
  OutputFile(const std::filesystem::path& path, const NpyLimits& limits) : path_(path), limits_(limits) {
    int fd;
    do fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno == ENOENT)
      throw std::runtime_error(fmt::format("{}: no such file (the worker did not write it)", path.string()));
    if (fd < 0) throw std::runtime_error(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
    fd_ = fd;
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      const int error = errno;
      ::close(fd_);
      throw std::runtime_error(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(error)));
    }
    if (!S_ISREG(info.st_mode)) {
      ::close(fd_);
      const char* kind = S_ISFIFO(info.st_mode)  ? "a FIFO"
                         : S_ISDIR(info.st_mode) ? "a folder"
                         : S_ISCHR(info.st_mode) ? "a character device"
                         : S_ISBLK(info.st_mode) ? "a block device"
                         : S_ISSOCK(info.st_mode) ? "a socket"
                                                  : "not a file";
      throw std::runtime_error(
          fmt::format("{}: is {}, not a regular file (a worker writes its outputs as files): refused unread",
                      path.string(), kind));
    }
    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    bytes_ = static_cast<std::uintmax_t>(info.st_size);
  }
  ~OutputFile() { ::close(fd_); }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  std::uintmax_t bytes() const { return bytes_; }

  /// Reads `count` bytes, in slices, checking the deadline after each; the
  /// number read (fewer at the end of the file).
  std::size_t read(char* into, std::size_t count) {
    std::size_t done = 0;
    while (done < count) {
      const std::size_t slice = std::min<std::size_t>(count - done, std::size_t{1} << 24);
      const ssize_t got = ::read(fd_, into + done, slice);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw std::runtime_error(fmt::format("{}: cannot read: {}", path_.string(), std::strerror(errno)));
      if (got == 0) break;
      done += static_cast<std::size_t>(got);
      if (std::chrono::steady_clock::now() > limits_.deadline)
        throw std::runtime_error(fmt::format("{}: not read within the worker's watchdog", path_.string()));
    }
    return done;
  }

 private:
  std::filesystem::path path_;
  NpyLimits limits_;
  int fd_ = -1;
  std::uintmax_t bytes_ = 0;
};

}  // namespace

NpyArray read_npy(const std::filesystem::path& path, const NpyLimits& limits) {
  OutputFile in(path, limits);
  // The size first: a file past the most that the caller can use (a sparse
  // 4 GiB one, say) is refused before a byte of it is read.
  constexpr std::uintmax_t kMaxHeader = 12 + (1u << 20);
  if (limits.max_data_bytes < std::numeric_limits<std::uintmax_t>::max() - kMaxHeader &&
      in.bytes() > kMaxHeader + limits.max_data_bytes)
    throw std::runtime_error(fmt::format("{}: {} bytes, more than an .npy of the problem's output can be "
                                         "(at most {} data bytes): refused unread",
                                         path.string(), in.bytes(), limits.max_data_bytes));
  char magic[kMagicBytes + 2] = {};
  if (in.read(magic, sizeof magic) != sizeof magic || std::memcmp(magic, kMagic, kMagicBytes) != 0)
    throw std::runtime_error(fmt::format("{}: not an .npy file", path.string()));
  std::uint32_t length = 0;
  std::size_t length_bytes = 0;
  if (magic[kMagicBytes] == 1) {
    std::uint16_t short_length = 0;
    length_bytes = in.read(reinterpret_cast<char*>(&short_length), 2) == 2 ? 2 : 0;
    length = short_length;
  } else if (magic[kMagicBytes] == 2 || magic[kMagicBytes] == 3) {
    length_bytes = in.read(reinterpret_cast<char*>(&length), 4) == 4 ? 4 : 0;
  } else {
    throw std::runtime_error(fmt::format("{}: .npy version {} is not supported", path.string(), int{magic[kMagicBytes]}));
  }
  if (length_bytes == 0 || length > (1u << 20))
    throw std::runtime_error(fmt::format("{}: malformed .npy header", path.string()));
  std::string header(length, '\0');
  if (in.read(header.data(), length) != length)
    throw std::runtime_error(fmt::format("{}: truncated .npy header", path.string()));
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
  // The header is the worker's word: check its size against the file and the
  // limit before allocating (a forged shape must not exhaust memory or overflow).
  const std::uintmax_t data_start = sizeof magic + length_bytes + length;
  const std::uintmax_t file_bytes = in.bytes();
  std::uintmax_t want = item;
  for (std::int64_t extent : array.shape) {
    if (extent != 0 && want > std::numeric_limits<std::uintmax_t>::max() / static_cast<std::uintmax_t>(extent))
      throw std::runtime_error(fmt::format("{}: .npy shape {} is too large", path.string(), shape_text(array.shape)));
    want *= static_cast<std::uintmax_t>(extent);
  }
  if (file_bytes < data_start || file_bytes - data_start != want)
    throw std::runtime_error(fmt::format("{}: {} data bytes for shape {} of '{}', expected {}", path.string(),
                                         file_bytes - std::min(file_bytes, data_start), shape_text(array.shape),
                                         array.descr, want));
  if (want > limits.max_data_bytes)
    throw std::runtime_error(fmt::format("{}: shape {} of '{}' is {} data bytes, more than the problem's output can "
                                         "be (at most {}): refused unread",
                                         path.string(), shape_text(array.shape), array.descr, want,
                                         limits.max_data_bytes));
  array.bytes.resize(static_cast<std::size_t>(want));
  const std::size_t got = in.read(array.bytes.data(), array.bytes.size());
  if (got != want)
    throw std::runtime_error(fmt::format("{}: {} data bytes for shape {} of '{}', expected {}", path.string(), got,
                                         shape_text(array.shape), array.descr, want));
  return array;
}

}  // namespace flashcheck::external
