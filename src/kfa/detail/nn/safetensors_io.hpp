#ifndef KFA_DETAIL_NN_SAFETENSORS_IO_HPP
#define KFA_DETAIL_NN_SAFETENSORS_IO_HPP

// The safetensors file format: an 8-byte little-endian header length N, N
// bytes of JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {...}}),
// then the tensors' little-endian bytes. Parsing and writing live in
// safetensors_io.cpp (compiled into libkfa), so that the JSON parser is a
// build dependency of kfa only, never of the headers its users include.

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace kfa {
namespace Impl {

/// One tensor of a file's header, checked against the file: its bytes
/// [begin, end) of the data section hold numel·dtype size bytes.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;
  std::vector<std::size_t> shape;
  std::uint64_t begin = 0, end = 0;
};

/// A safetensors file opened for reading: the header is parsed and every
/// tensor's extent checked against the file size on construction (throws
/// std::runtime_error naming the file, and the tensor where there is one).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return m_path; }
  /// The tensors in the order of their data.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return m_tensors; }
  const std::map<std::string, std::string>& metadata() const { return m_metadata; }
  /// nullptr when the file has no tensor `name`.
  const SafetensorsTensorInfo* find(const std::string& name) const;

  /// Reads `tensor`'s values converted to double or float into `out`
  /// (numel elements). The dtype must be safetensors_convertible.
  void read(const SafetensorsTensorInfo& tensor, double* out);
  void read(const SafetensorsTensorInfo& tensor, float* out);

 private:
  std::vector<unsigned char> read_bytes(const SafetensorsTensorInfo& tensor);

  std::string m_path;
  std::ifstream m_file;
  std::uint64_t m_data_start = 0;
  std::vector<SafetensorsTensorInfo> m_tensors;
  std::map<std::string, std::string> m_metadata;
};

/// Bytes per element of a safetensors dtype ("F32", "BF16", ...); 0 for a
/// dtype this reader does not know.
std::size_t safetensors_dtype_size(const std::string& dtype);

/// Whether SafetensorsReader::read converts `dtype`: the floating types F64,
/// F32, F16, BF16 and the integer types (I64 ... U8, BOOL).
bool safetensors_convertible(const std::string& dtype);

/// One tensor to write: its bytes are already little-endian `dtype` values.
struct SafetensorsRecord {
  std::string name;
  std::string dtype;
  std::vector<std::size_t> shape;
  const void* data = nullptr;
  std::size_t bytes = 0;
};

/// Writes `records` (in this order) and `metadata` as a safetensors file:
/// first to `path` + ".partial", renamed to `path` once complete, so a
/// failed write leaves no truncated file behind. Throws std::runtime_error.
void safetensors_write(const std::string& path, const std::vector<SafetensorsRecord>& records,
                       const std::map<std::string, std::string>& metadata);

/// "[2][3]" (the house's extent notation).
std::string safetensors_shape_string(const std::vector<std::size_t>& shape);

}  // namespace Impl
}  // namespace kfa

#endif
