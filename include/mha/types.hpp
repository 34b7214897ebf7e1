// Core value types of the mha C++ API: Status (error code + message) and TensorView (a
// non-owning, strided view of up to 4 dimensions).
#ifndef MHA_TYPES_HPP_
#define MHA_TYPES_HPP_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#if defined(_WIN32)
#define MHA_API __declspec(dllexport)
#else
#define MHA_API __attribute__((visibility("default")))
#endif

namespace mha {

// Error categories. Values match the C API's mha_status codes.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // a caller-supplied value is out of its documented range
  kOutOfMemory = 2,      // an arena or allocation could not hold the request
  kIoError = 3,          // a file could not be opened, read, mapped or written
  kFormatError = 4,      // a file's contents are malformed
  kUnsupported = 5,      // valid but not implemented (e.g. a dtype a kernel lacks)
  kInternal = 6,         // a broken invariant inside mha: a bug
};

// [[nodiscard]] with MHA_API's export: GCC takes the two together only in one attribute list.
#if defined(_WIN32)
#define MHA_NODISCARD_API [[nodiscard]] MHA_API
#else
#define MHA_NODISCARD_API [[nodiscard, gnu::visibility("default")]]
#endif

// The result of every fallible call; [[nodiscard]]: ignoring one drops its error. A failed Status carries a message that names the argument,
// the expected and the actual value ("query: expected 3 dims [L, N, E], got 2 dims [4, 8]").
// Successful Status objects never allocate.
class MHA_NODISCARD_API Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: <message>", or "OK".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

MHA_API Status InvalidArgument(std::string message);
MHA_API Status OutOfMemory(std::string message);
MHA_API Status IoError(std::string message);
MHA_API Status FormatError(std::string message);
MHA_API Status Unsupported(std::string message);
MHA_API Status Internal(std::string message);
MHA_API const char* StatusCodeName(StatusCode code);

// Element types. f32 is the compute type; bf16/f16 are storage types for weights and caches;
// bool (1 byte, nonzero = true) and u8 are for masks.
// kI8 (signed 8-bit) is a KV-cache storage type (KvCacheOptions::dtype) and, with kI4 (signed
// 4-bit), a quantized storage of the projection weights (AttentionConfig::weight_dtype: codes
// and f32 scales made at layer creation, README "Quantized weights"); no tensor view holds kI4
// (DTypeSize 0). kI32 and kI64 are for token positions (AttentionInputs::positions).
enum class DType : int {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kBool = 3,
  kU8 = 4,
  kI8 = 5,
  kI32 = 6,
  kI64 = 7,
  kI4 = 8
};
MHA_API size_t DTypeSize(DType dtype);
MHA_API const char* DTypeName(DType dtype);

inline constexpr int kMaxRank = 4;

// A non-owning view of a strided tensor. Shape and strides are in elements (not bytes), outermost
// dimension first; strides may be any non-negative value (0 broadcasts). The viewed memory must
// outlive every use of the view. A default-constructed view is "absent" (data == nullptr,
// rank == 0) and is how optional inputs are passed.
struct MHA_API TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  int64_t shape[kMaxRank] = {0, 0, 0, 0};
  int64_t strides[kMaxRank] = {0, 0, 0, 0};

  // A dense row-major view. Fails (InvalidArgument, naming `name`) on a null pointer, a rank
  // outside 1..4, a dimension < 0 (or == 0 unless allow_empty), or an element count or byte size
  // that overflows int64.
  static Status Dense(void* data, DType dtype, int rank, const int64_t* shape, TensorView* out,
                      const char* name = "tensor", bool allow_empty = false);
  // A strided view; same checks, plus negative strides are rejected.
  static Status Strided(void* data, DType dtype, int rank, const int64_t* shape,
                        const int64_t* strides, TensorView* out, const char* name = "tensor",
                        bool allow_empty = false);

  bool present() const { return data != nullptr; }
  int64_t NumElements() const;
  // True when the strides are those of a dense row-major layout of `shape`.
  bool IsContiguous() const;
  // "[2, 3, 4] f32" — for error messages.
  std::string ShapeString() const;

  template <typename T>
  T* As() const { return static_cast<T*>(data); }
};

}  // namespace mha

#endif  // MHA_TYPES_HPP_
