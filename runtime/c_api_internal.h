// Shared by the C API's translation units (runtime/c_api.cc, runtime/c_api_kv.cc): the handle
// definitions, the error recording, the exception guard and the mha_tensor conversion. Not part
// of the public API.
#ifndef MHA_RUNTIME_C_API_INTERNAL_H_
#define MHA_RUNTIME_C_API_INTERNAL_H_

#include <exception>
#include <memory>
#include <new>
#include <string>

#include "mha/mha.h"
#include "mha/mha.hpp"

// The C handles are the C++ objects, wrapped so the C header stays free of C++ types.
struct mha_context {
  // The host's mha_executor as an mha::Executor, or null; declared first so that it outlives
  // the context running on it.
  std::unique_ptr<mha::Executor> executor;
  std::unique_ptr<mha::Context> impl;
};

struct mha_layer {
  std::unique_ptr<mha::MultiheadAttention> impl;
};

namespace mha {
namespace c_api {

// Stores `s`'s message as the calling thread's last error ("" for success) and returns its code.
mha_status Record(const Status& s);
mha_status Fail(StatusCode code, std::string message);

// Runs `body` (returning Status) and converts it, and any exception, to an mha_status.
// `fn` prefixes messages so the caller knows which call failed.
template <typename Body>
mha_status Guard(const char* fn, Body&& body) {
  try {
    Status s = body();
    if (!s.ok()) s = Status(s.code(), std::string(fn) + ": " + s.message());
    return Record(s);
  } catch (const std::bad_alloc&) {
    return Fail(StatusCode::kOutOfMemory, std::string(fn) + ": out of memory");
  } catch (const std::exception& e) {
    return Fail(StatusCode::kInternal, std::string(fn) + ": unexpected exception: " + e.what());
  } catch (...) {
    return Fail(StatusCode::kInternal, std::string(fn) + ": unexpected exception");
  }
}

// "NAME: expected a non-NULL pointer, got NULL".
Status NullArg(const char* name);

// Converts a C tensor description. `required`: data must be non-NULL; otherwise a NULL struct
// pointer or NULL data gives an absent view. All-zero strides mean dense row-major.
Status ToView(const mha_tensor* t, const char* name, bool required, TensorView* out);
// The same for an optional token-positions tensor, whose dtype must be MHA_DTYPE_I32 or
// MHA_DTYPE_I64.
Status ToPositionsView(const mha_tensor* t, const char* name, TensorView* out);

}  // namespace c_api
}  // namespace mha

#endif  // MHA_RUNTIME_C_API_INTERNAL_H_
