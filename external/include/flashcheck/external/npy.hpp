// .npy files (NumPy's format, version 1.0): the arrays that flashcheck and an
// external worker exchange. No C++ .npy library is packaged for Debian, and
// the format is a magic string, a length and a Python-literal header over
// little-endian C-order data, so the few lines are written here.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace flashcheck::external {

/// One array: its NumPy type string ('<f4', '<f2', '<u2', ...), shape and
/// raw little-endian C-order bytes.
struct NpyArray {
  std::string descr;
  std::vector<std::int64_t> shape;
  std::vector<char> bytes;

  std::int64_t elements() const;
};

/// Writes an array; throws std::runtime_error naming the file.
void write_npy(const std::filesystem::path& path, const std::string& descr, const std::vector<std::int64_t>& shape,
               const void* data, std::size_t bytes);

/// What a reader accepts of a file that someone else (a worker) wrote.
struct NpyLimits {
  /// The most data bytes (after the header) the caller can use: a larger
  /// file is refused by its size, before anything is read.
  std::uintmax_t max_data_bytes = std::numeric_limits<std::uintmax_t>::max();
  /// When reading must have finished (a worker's watchdog); max: no limit.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

/// Reads an array; throws std::runtime_error naming the file and what is wrong
/// with it (not a regular file, such as a FIFO, which is never opened for a
/// blocking read; larger than `limits` allows; not an .npy file; Fortran
/// order; a size that the shape contradicts; not read by the deadline).
NpyArray read_npy(const std::filesystem::path& path, const NpyLimits& limits = {});

/// "[2, 3, 4]", for messages.
std::string shape_text(const std::vector<std::int64_t>& shape);

}  // namespace flashcheck::external
