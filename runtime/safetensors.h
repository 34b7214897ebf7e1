// safetensors: a strict reader (memory-mapped or over a caller's buffer) and an atomic writer.
//
// File format (https://github.com/huggingface/safetensors):
//   bytes [0, 8)        N, the header length, a little-endian u64
//   bytes [8, 8 + N)    the header: UTF-8 JSON, an object mapping each tensor name to
//                       {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
//                       plus an optional "__metadata__" object of string -> string
//   bytes [8 + N, end)  the data region; data_offsets are byte offsets into it, row-major,
//                       little-endian elements
//
// Validation is strict and happens once, in Open/FromBuffer; every failure is a FormatError
// whose message names the file, the tensor (or field) and the expected and actual values:
//   - the file holds at least 8 bytes; N <= kMaxHeaderBytes (100,000,000, the Rust
//     implementation's limit) and N <= file size - 8;
//   - the header is valid UTF-8, starts with '{' and is one JSON object, nothing after it but
//     whitespace (the Python library pads with spaces); nesting deeper than 3 levels (object ->
//     tensor object -> shape array) is rejected while parsing, so hostile nesting cannot exhaust
//     the stack or memory;
//   - no duplicate tensor names, no duplicate fields inside a tensor entry, no fields other than
//     dtype/shape/data_offsets (all three required), "__metadata__" values are strings;
//   - dtype is one of BOOL U8 I8 I16 U16 I32 U32 I64 U64 F16 BF16 F32 F64 C64 F8_E4M3 F8_E5M2
//     F8_E8M0 (sub-byte types such as F4/F6 are rejected as unknown);
//   - shape is an array of non-negative integers < 2^63 whose element count and byte size do
//     not overflow 64 bits;
//   - data_offsets is two ascending integers, end - begin == elements * dtype size,
//     end <= data region size;
//   - the tensors tile the data region exactly, as the Rust reference implementation requires:
//     sorted by offset, each begins where the previous one ends (no overlap, no hole), the first
//     begins at 0 and the last ends at the end of the file (no trailing bytes).
// Nothing is allocated in proportion to a size the file claims before that size is checked
// against the real file size.
//
// Little-endian hosts only: element bytes are used as they are in the file, so Open/FromBuffer
// return Unsupported on a big-endian host.
//
// Thread-safety: a SafeTensorsFile is immutable after Open; concurrent const calls are safe.
#ifndef MHA_RUNTIME_SAFETENSORS_H_
#define MHA_RUNTIME_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "mha/types.hpp"

namespace mha {

// The Rust implementation's header limit; larger headers are rejected before anything is read.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  // The dtype string as written in the file ("F32", "I64", ...).
  std::string dtype_name;
  // True when dtype_name maps to an mha::DType (F32, F16, BF16, BOOL, U8, I32, I64); other dtypes
  // are validated for size but every accessor reports Unsupported for them.
  bool supported = false;
  DType dtype = DType::kF32;  // meaningful only when supported
  size_t element_size = 0;    // bytes per element of dtype_name
  // Outermost first; empty for a rank-0 scalar (1 element).
  std::vector<int64_t> shape;
  uint64_t num_elements = 0;
  // data_offsets[0], relative to the first byte of the data region, and end - begin.
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  // The tensor's bytes inside the mapping/buffer (little-endian elements, row-major). Only
  // 1-byte alignment is guaranteed.
  const uint8_t* data = nullptr;

  int rank() const { return static_cast<int>(shape.size()); }
  // "[2, 3] F32" — for error messages.
  std::string ShapeString() const;
};

class SafeTensorsFile {
 public:
  SafeTensorsFile() = default;
  ~SafeTensorsFile();
  SafeTensorsFile(SafeTensorsFile&& other) noexcept;
  SafeTensorsFile& operator=(SafeTensorsFile&& other) noexcept;
  SafeTensorsFile(const SafeTensorsFile&) = delete;
  SafeTensorsFile& operator=(const SafeTensorsFile&) = delete;

  // Memory-maps `path` read-only (the descriptor is closed once mapped) and validates it.
  // IoError when the file cannot be opened, stat'ed or mapped; FormatError when it is
  // malformed. *out is replaced only on success.
  static Status Open(const std::string& path, SafeTensorsFile* out);
  // Validates a caller-owned buffer without copying it; the buffer must outlive *out and every
  // pointer or view obtained from it. `name` labels error messages.
  static Status FromBuffer(const uint8_t* data, size_t size, SafeTensorsFile* out,
                           const std::string& name = "<buffer>");

  // Number of tensors.
  size_t size() const { return tensors_.size(); }
  // Tensor names in header (file) order.
  std::vector<std::string> names() const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Copies tensor `name` into *out as f32 (row-major, num_elements values): F32 is copied,
  // F16 and BF16 are widened exactly (every f16/bf16 value, including subnormals, infinities
  // and NaN payloads, is representable in f32). Errors: InvalidArgument for an absent name,
  // Unsupported for any other dtype.
  Status GetF32(const std::string& name, std::vector<float>* out) const;
  // A zero-copy dense view of an F32 tensor of rank 0..4 (rank 0 is viewed as shape [1]) whose
  // bytes are 4-byte aligned (always true for files written with 8-byte-padded headers and
  // opened with Open). The view points into read-only memory: never write through it.
  // Unsupported for other dtypes, misaligned data or rank > 4 (use GetF32).
  Status ViewF32(const std::string& name, TensorView* out) const;
  // Copies a BOOL or U8 tensor; BOOL bytes are normalized to 0/1 (nonzero = true).
  Status GetBool(const std::string& name, std::vector<uint8_t>* out) const;
  // Copies an I32 or I64 tensor (token positions) as int64 values.
  Status GetInt64(const std::string& name, std::vector<int64_t>* out) const;

 private:
  // *out = the tensor `name`, or InvalidArgument naming the file and the absent name.
  Status FindOrError(const std::string& name, const TensorInfo** out) const;
  Status Parse(const uint8_t* data, size_t size);
  void Unmap();

  std::string path_;
  void* mapping_ = nullptr;  // owned mmap, or nullptr for FromBuffer
  size_t mapping_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory and writes it atomically. Tensor bytes are copied at Add,
// so the caller's buffers may be freed right away. Tensors are laid out in insertion order,
// back to back; the header is padded with spaces to a multiple of 8 bytes (as the Python
// library does), so every tensor starts 8-byte aligned when all element sizes divide 8.
class SafeTensorsWriter {
 public:
  // `data` holds prod(shape) elements of `dtype`, row-major, little-endian. An empty shape is
  // a rank-0 scalar. InvalidArgument for an empty, duplicate, non-UTF-8 or "__metadata__"
  // name, a negative dimension, an overflowing size, or null data with a nonzero size.
  Status Add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
             const void* data);
  // Same with any safetensors dtype string (e.g. "F64", "I64"); `nbytes` must equal
  // prod(shape) * element size.
  Status AddRaw(const std::string& name, const std::string& dtype_name,
                const std::vector<int64_t>& shape, const void* data, size_t nbytes);
  // Keys and values must be valid UTF-8; a repeated key replaces the value.
  Status AddMetadata(const std::string& key, const std::string& value);

  // The complete file contents.
  Status Serialize(std::vector<uint8_t>* out) const;
  // Writes to "<path>.tmp.<pid>", flushes it to disk, then renames it over `path`. On any error
  // the temporary file is removed and `path` is untouched. IoError names the path and errno.
  Status WriteFile(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    std::string dtype_name;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

// Safetensors dtype string for an mha DType ("F32", "BF16", "F16", "BOOL", "U8", "I8", "I32",
// "I64").
const char* SafeTensorsDTypeName(DType dtype);
// Exact widening conversions (bit patterns in, f32 out).
float F16BitsToF32(uint16_t bits);
float BF16BitsToF32(uint16_t bits);

}  // namespace mha

#endif  // MHA_RUNTIME_SAFETENSORS_H_
