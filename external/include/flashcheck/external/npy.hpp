// .npy files (NumPy's format, version 1.0): the arrays that flashcheck and an
// external worker exchange. No C++ .npy library is packaged for Debian, and
// the format is a magic string, a length and a Python-literal header over
// little-endian C-order data, so the few lines are written here.
#pragma once

#include <cstdint>
#include <filesystem>
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

/// Reads an array; throws std::runtime_error naming the file and what is wrong
/// with it (not an .npy file, Fortran order, a size that the shape contradicts).
NpyArray read_npy(const std::filesystem::path& path);

/// "[2, 3, 4]", for messages.
std::string shape_text(const std::vector<std::int64_t>& shape);

}  // namespace flashcheck::external
