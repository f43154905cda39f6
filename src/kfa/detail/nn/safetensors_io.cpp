#include <kfa/detail/nn/safetensors_io.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

// Tensors are written from the host's own bytes; safetensors is little-endian.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kfa's safetensors writer assumes a little-endian host"
#endif

namespace kfa {
namespace Impl {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error("kfa::nn safetensors file '" + path + "': " + what);
}

std::uint64_t little_endian(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int b = bytes - 1; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

/// IEEE binary16 to double, exactly (subnormals, infinities and NaN included).
double half_to_double(std::uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(double(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(double(mantissa | 0x400), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

/// bfloat16 is the upper half of a binary32: exact.
float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <class T>
void convert(const std::string& dtype, const unsigned char* in, std::size_t n, T* out) {
  if (dtype == "F64") {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t bits = little_endian(in + 8 * i, 8);
      double d;
      std::memcpy(&d, &bits, sizeof d);
      out[i] = static_cast<T>(d);
    }
  } else if (dtype == "F32") {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint32_t bits = std::uint32_t(little_endian(in + 4 * i, 4));
      float f;
      std::memcpy(&f, &bits, sizeof f);
      out[i] = static_cast<T>(f);
    }
  } else if (dtype == "F16") {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(half_to_double(std::uint16_t(little_endian(in + 2 * i, 2))));
  } else if (dtype == "BF16") {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = static_cast<T>(bf16_to_float(std::uint16_t(little_endian(in + 2 * i, 2))));
  } else {
    // Integer types: sign-extend the signed ones from their width.
    const int size = int(safetensors_dtype_size(dtype));
    const bool is_signed = dtype[0] == 'I';
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t bits = little_endian(in + size * i, size);
      if (is_signed) {
        const int shift = 64 - 8 * size;
        const std::int64_t value =
            static_cast<std::int64_t>(bits << shift) >> shift;  // arithmetic shift
        out[i] = static_cast<T>(value);
      } else {
        out[i] = static_cast<T>(bits);
      }
    }
  }
}

}  // namespace

std::size_t safetensors_dtype_size(const std::string& dtype) {
  static const std::map<std::string, std::size_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
      {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2}, {"U8", 1},
      {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

bool safetensors_convertible(const std::string& dtype) {
  return safetensors_dtype_size(dtype) != 0 && dtype.compare(0, 3, "F8_") != 0;
}

std::string safetensors_shape_string(const std::vector<std::size_t>& shape) {
  std::ostringstream out;
  for (std::size_t e : shape) out << "[" << e << "]";
  return shape.empty() ? "[] (a scalar)" : out.str();
}

SafetensorsReader::SafetensorsReader(const std::string& path)
    : m_path(path), m_file(path, std::ios::binary) {
  if (!m_file) fail(path, "cannot open it for reading");
  m_file.seekg(0, std::ios::end);
  const std::uint64_t file_size = std::uint64_t(m_file.tellg());
  m_file.seekg(0);
  if (file_size < 8) {
    fail(path, "truncated: " + std::to_string(file_size) +
                   " bytes, fewer than the 8-byte header length");
  }
  unsigned char length_bytes[8];
  m_file.read(reinterpret_cast<char*>(length_bytes), 8);
  const std::uint64_t header_length = little_endian(length_bytes, 8);
  if (header_length > file_size - 8) {
    fail(path, "header length " + std::to_string(header_length) +
                   " runs past the end of the file (" + std::to_string(file_size) +
                   " bytes): truncated or not a safetensors file");
  }
  std::string text(header_length, '\0');
  m_file.read(&text[0], std::streamsize(header_length));
  if (!m_file) fail(path, "cannot read the header");
  m_data_start = 8 + header_length;
  const std::uint64_t data_size = file_size - m_data_start;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("bad header (not JSON): ") + e.what());
  }
  if (!header.is_object()) fail(path, "bad header: not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "bad header: __metadata__ is not an object");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          fail(path, "bad header: __metadata__ entry '" + m.key() + "' is not a string");
        m_metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "bad header entry for tensor '" + name + "': ";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      fail(path, where + "needs dtype, shape and data_offsets");
    }
    const nlohmann::json &dtype = entry["dtype"], &shape = entry["shape"],
                         &offsets = entry["data_offsets"];
    if (!dtype.is_string()) fail(path, where + "dtype is not a string");
    SafetensorsTensorInfo info;
    info.name = name;
    info.dtype = dtype.get<std::string>();
    const std::size_t element = safetensors_dtype_size(info.dtype);
    if (element == 0) fail(path, where + "unknown dtype " + info.dtype);
    if (!shape.is_array()) fail(path, where + "shape is not an array");
    // The element count, guarded against overflow: a hostile shape must not
    // wrap around and pass the size check below.
    std::uint64_t numel = 1;
    for (const auto& e : shape) {
      if (!e.is_number_unsigned()) fail(path, where + "shape has an entry that is not a count");
      const std::uint64_t extent = e.get<std::uint64_t>();
      if (extent != 0 && numel > std::numeric_limits<std::uint64_t>::max() / extent / element)
        fail(path, where + "shape too large");
      numel *= extent;
      info.shape.push_back(std::size_t(extent));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(path, where + "data_offsets must be [begin, end]");
    }
    info.begin = offsets[0].get<std::uint64_t>();
    info.end = offsets[1].get<std::uint64_t>();
    if (info.end < info.begin || info.end - info.begin != numel * element) {
      fail(path, where + "data_offsets [" + std::to_string(info.begin) + ", " +
                     std::to_string(info.end) + "] do not hold " + std::to_string(numel) + " " +
                     info.dtype + " values");
    }
    if (info.end > data_size) {
      fail(path, "truncated: tensor '" + name + "' ends at byte " + std::to_string(info.end) +
                     " of the data, which has " + std::to_string(data_size) + " bytes");
    }
    m_tensors.push_back(std::move(info));
  }
  std::sort(m_tensors.begin(), m_tensors.end(),
            [](const SafetensorsTensorInfo& a, const SafetensorsTensorInfo& b) {
              return a.begin < b.begin;
            });
}

const SafetensorsTensorInfo* SafetensorsReader::find(const std::string& name) const {
  for (const auto& t : m_tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<unsigned char> SafetensorsReader::read_bytes(const SafetensorsTensorInfo& tensor) {
  std::vector<unsigned char> bytes(tensor.end - tensor.begin);
  m_file.clear();
  m_file.seekg(std::streamoff(m_data_start + tensor.begin));
  m_file.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!m_file) fail(m_path, "cannot read the data of tensor '" + tensor.name + "'");
  return bytes;
}

void SafetensorsReader::read(const SafetensorsTensorInfo& tensor, double* out) {
  const auto bytes = read_bytes(tensor);
  convert(tensor.dtype, bytes.data(), bytes.size() / safetensors_dtype_size(tensor.dtype), out);
}

void SafetensorsReader::read(const SafetensorsTensorInfo& tensor, float* out) {
  const auto bytes = read_bytes(tensor);
  convert(tensor.dtype, bytes.data(), bytes.size() / safetensors_dtype_size(tensor.dtype), out);
}

void safetensors_write(const std::string& path, const std::vector<SafetensorsRecord>& records,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& r : records) {
    if (r.name == "__metadata__" || header.contains(r.name))
      fail(path, "cannot write tensor '" + r.name + "': duplicate or reserved name");
    header[r.name] = {{"dtype", r.dtype},
                      {"shape", r.shape},
                      {"data_offsets", {offset, offset + r.bytes}}};
    offset += r.bytes;
  }
  std::string text = header.dump();
  // Pad with spaces so that the data starts 8-byte aligned, as the
  // reference writer does (readers may map the data in place).
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string partial = path + ".partial";
  {
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    if (!file) fail(path, "cannot open " + partial + " for writing");
    unsigned char length[8];
    for (int b = 0; b < 8; ++b) length[b] = static_cast<unsigned char>(text.size() >> (8 * b));
    file.write(reinterpret_cast<const char*>(length), 8);
    file.write(text.data(), std::streamsize(text.size()));
    for (const auto& r : records)
      file.write(static_cast<const char*>(r.data), std::streamsize(r.bytes));
    file.close();
    if (!file) {
      std::remove(partial.c_str());
      fail(path, "writing " + partial + " failed");
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    fail(path, "cannot rename " + partial + " to it");
  }
}

}  // namespace Impl
}  // namespace kfa
