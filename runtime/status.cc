// Status helpers and tensor-view construction (include/mha/types.hpp).
#include <limits>
#include <string>

#include "mha/types.hpp"

namespace mha {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kOutOfMemory: return "OutOfMemory";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kFormatError: return "FormatError";
    case StatusCode::kUnsupported: return "Unsupported";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status InvalidArgument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status OutOfMemory(std::string m) { return Status(StatusCode::kOutOfMemory, std::move(m)); }
Status IoError(std::string m) { return Status(StatusCode::kIoError, std::move(m)); }
Status FormatError(std::string m) { return Status(StatusCode::kFormatError, std::move(m)); }
Status Unsupported(std::string m) { return Status(StatusCode::kUnsupported, std::move(m)); }
Status Internal(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kBF16:
    case DType::kF16: return 2;
    case DType::kBool:
    case DType::kU8:
    case DType::kI8: return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kI4:
      return 0;  // two codes per byte: weight storage only, never a tensor's element type
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kBool: return "bool";
    case DType::kU8: return "u8";
    case DType::kI8: return "i8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kI4:
      return "i4";
  }
  return "invalid";
}

namespace {

std::string ShapeOf(int rank, const int64_t* shape) {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace

Status TensorView::Strided(void* data, DType dtype, int rank, const int64_t* shape,
                           const int64_t* strides, TensorView* out, const char* name,
                           bool allow_empty) {
  if (out == nullptr) return InvalidArgument(std::string(name) + ": output view is null");
  if (DTypeSize(dtype) == 0) {
    return InvalidArgument(std::string(name) + ": expected a valid dtype, got " +
                           std::to_string(static_cast<int>(dtype)));
  }
  if (rank < 1 || rank > kMaxRank) {
    return InvalidArgument(std::string(name) + ": expected rank 1..4, got " +
                           std::to_string(rank));
  }
  if (shape == nullptr || strides == nullptr) {
    return InvalidArgument(std::string(name) + ": shape or strides pointer is null");
  }
  // The byte extent is 1 + sum((shape[i]-1) * stride[i]) elements; each step is overflow-checked.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  int64_t count = 1;
  int64_t extent = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = shape[i];
    if (d < 0 || (d == 0 && !allow_empty)) {
      return InvalidArgument(std::string(name) + ": expected dimension " + std::to_string(i) +
                             " to be " + (allow_empty ? ">= 0" : "> 0") + ", got shape " +
                             ShapeOf(rank, shape));
    }
    if (strides[i] < 0) {
      return InvalidArgument(std::string(name) + ": expected non-negative strides, got stride " +
                             std::to_string(strides[i]) + " in dimension " + std::to_string(i));
    }
    if (d != 0 && count > kMax / d) {
      return InvalidArgument(std::string(name) + ": element count of shape " +
                             ShapeOf(rank, shape) + " overflows 64 bits");
    }
    count *= d;
    if (d > 1) {
      if (strides[i] != 0 && (d - 1) > (kMax - extent) / strides[i]) {
        return InvalidArgument(std::string(name) + ": extent of shape " + ShapeOf(rank, shape) +
                               " with the given strides overflows 64 bits");
      }
      extent += (d - 1) * strides[i];
    }
  }
  if (extent > kMax / static_cast<int64_t>(DTypeSize(dtype))) {
    return InvalidArgument(std::string(name) + ": byte size of shape " + ShapeOf(rank, shape) +
                           " overflows 64 bits");
  }
  if (data == nullptr && count != 0) {
    return InvalidArgument(std::string(name) + ": data pointer is null for shape " +
                           ShapeOf(rank, shape));
  }
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.rank = rank;
  for (int i = 0; i < rank; ++i) {
    v.shape[i] = shape[i];
    v.strides[i] = strides[i];
  }
  *out = v;
  return Status::Ok();
}

Status TensorView::Dense(void* data, DType dtype, int rank, const int64_t* shape, TensorView* out,
                         const char* name, bool allow_empty) {
  if (rank < 1 || rank > kMaxRank) {
    return InvalidArgument(std::string(name) + ": expected rank 1..4, got " +
                           std::to_string(rank));
  }
  if (shape == nullptr) return InvalidArgument(std::string(name) + ": shape pointer is null");
  int64_t strides[kMaxRank] = {0, 0, 0, 0};
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    strides[i] = s;
    // Overflow of the running product is caught by Strided's extent check except when it wraps
    // here first; saturate so Strided reports it.
    if (shape[i] > 0 && s > std::numeric_limits<int64_t>::max() / shape[i]) {
      s = std::numeric_limits<int64_t>::max();
    } else if (shape[i] > 0) {
      s *= shape[i];
    }
  }
  return Strided(data, dtype, rank, shape, strides, out, name, allow_empty);
}

int64_t TensorView::NumElements() const {
  if (rank == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool TensorView::IsContiguous() const {
  int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

std::string TensorView::ShapeString() const {
  return ShapeOf(rank, shape) + " " + DTypeName(dtype);
}

}  // namespace mha
