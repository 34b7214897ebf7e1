// Helpers shared by the structured libFuzzer targets (operator_fuzz.cc, kv_cache_fuzz.cc):
// decoding fuzz bytes into bounded choices, output buffers with canary bytes, 16-bit weight
// values built without the library's converters, and the failure report.
#ifndef MHA_TOOLS_FUZZ_FUZZ_UTIL_H_
#define MHA_TOOLS_FUZZ_FUZZ_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mha/mha.h"

namespace mha {
namespace fuzz {

// Reads choices from the fuzz input, one byte each (two for wider ranges). An exhausted input
// reads as zeros, so every prefix of an input is itself a complete case (small values first).
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // A value in [lo, hi] (inclusive); hi - lo < 65536.
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
    const uint64_t raw = span > 256 ? (uint64_t{Byte()} << 8 | Byte()) : Byte();
    return lo + static_cast<int64_t>(raw % span);
  }
  bool Bool() { return Byte() & 1; }
  // True with probability about num / 256.
  bool Chance(int num) { return Byte() < num; }
  // The rest of the input hashed into a seed for the values (data, masks), so that mutating
  // the structure bytes keeps the values' distribution.
  uint32_t Seed() {
    uint32_t h = 2166136261u;
    while (pos_ < size_) h = (h ^ data_[pos_++]) * 16777619u;
    return h;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Attention heads: H in 1..8, head_dim from a list weighted to small and odd sizes (capped so that
// E = H * head_dim <= max_embed), and KVH = H, or (probability about 1 - full_heads / 256) a
// divisor of H (grouped-query and multi-query layers).
struct Heads {
  int64_t E = 1, H = 1, KVH = 1;
};
inline Heads DecodeHeads(ByteReader* r, int64_t max_embed, int full_heads) {
  Heads h;
  h.H = r->Range(1, 8);
  static constexpr int64_t kHeadDims[] = {1, 2, 3, 4, 5, 7, 8, 8, 16, 16, 17, 24, 32, 32, 33, 64};
  const int64_t hd = std::min<int64_t>(kHeadDims[r->Byte() % 16], max_embed / h.H);
  h.E = h.H * hd;
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= h.H; ++d) {
    if (h.H % d == 0) divisors.push_back(d);
  }
  const uint8_t g = r->Byte();
  h.KVH = g < full_heads ? h.H : divisors[g % divisors.size()];
  return h;
}

// Reports a broken contract with the case's description and aborts (libFuzzer saves the input).
[[noreturn]] inline void Fail(const std::string& what, const std::string& description) {
  std::fprintf(stderr, "\n=== fuzz finding: %s\ncase: %s\nlast mha message: %s\n", what.c_str(),
               description.c_str(), mha_last_error_message());
  std::abort();
}

// The byte every guarded buffer is filled with before a call. As f32: -2.6e36, a value no
// correct output has here.
constexpr uint8_t kCanaryByte = 0xFB;
// Canary bytes before and after the elements of every guarded buffer.
constexpr size_t kCanaryBytes = 64;

// A caller buffer of `elements` floats (or bytes, see `element_size`) between two canary
// regions, filled with kCanaryByte. `misalign` shifts the data by that many bytes from a 64-byte
// boundary (a multiple of the element size).
class GuardedBuffer {
 public:
  GuardedBuffer() = default;
  GuardedBuffer(size_t elements, size_t element_size, size_t misalign = 0) {
    Reset(elements, element_size, misalign);
  }
  void Reset(size_t elements, size_t element_size, size_t misalign = 0) {
    element_size_ = element_size;
    elements_ = elements;
    lead_ = kCanaryBytes + misalign;
    const size_t total = lead_ + elements * element_size + kCanaryBytes;
    storage_.assign(total + 64, kCanaryByte);
    // Align the start of the canary region to 64 bytes within the allocation.
    const uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    shift_ = static_cast<size_t>((64 - base % 64) % 64);
  }
  void Fill() { std::memset(storage_.data(), kCanaryByte, storage_.size()); }
  void* data() { return storage_.data() + shift_ + lead_; }
  float* f32() { return static_cast<float*>(data()); }
  size_t elements() const { return elements_; }
  size_t bytes() const { return elements_ * element_size_; }

  // Whether every byte (canaries and elements) still holds kCanaryByte.
  bool Untouched() const {
    for (uint8_t b : storage_) {
      if (b != kCanaryByte) return false;
    }
    return true;
  }
  // Whether every byte outside the elements whose indices `written` marks (one flag per element)
  // still holds kCanaryByte: the canaries, and the padding between a strided view's rows.
  bool OnlyWrote(const std::vector<char>& written) const {
    const uint8_t* p = storage_.data();
    const size_t begin = shift_ + lead_;
    for (size_t i = 0; i < storage_.size(); ++i) {
      if (i >= begin && i < begin + bytes() && written[(i - begin) / element_size_]) continue;
      if (p[i] != kCanaryByte) return false;
    }
    return true;
  }

 private:
  std::vector<uint8_t> storage_;
  size_t element_size_ = 4, elements_ = 0, lead_ = 0, shift_ = 0;
};

// A dense or strided mha_tensor (strides all zero = dense).
inline mha_tensor Tensor(void* data, int32_t dtype, int rank, const int64_t* shape,
                         const int64_t* strides) {
  mha_tensor t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.rank = rank;
  for (int i = 0; i < rank; ++i) {
    t.shape[i] = shape[i];
    t.strides[i] = strides ? strides[i] : 0;
  }
  return t;
}

// 16-bit weights: random values that a 16-bit format holds exactly, built here (not with mha's
// converters) so that the reference sees the values the layer must use.
inline uint16_t BF16Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return static_cast<uint16_t>(b >> 16);  // truncation: the value kept is exactly representable
}
inline float FromBF16(uint16_t h) {
  const uint32_t b = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}
// f16 of a value with |x| < 65504: truncated to 10 mantissa bits; magnitudes below 2^-14 (the
// f16 normal range) become 0, so no subnormal encoding is needed.
inline uint16_t F16Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const int exponent = static_cast<int>((b >> 23) & 0xFF) - 127;
  if (exponent < -14) return sign;
  const uint32_t mantissa = (b >> 13) & 0x3FFu;
  return static_cast<uint16_t>(sign | ((exponent + 15) << 10) | mantissa);
}
inline float FromF16(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F;
  const float mantissa = static_cast<float>(h & 0x3FF);
  const float magnitude = exponent == 0 ? mantissa * std::ldexp(1.0f, -24)
                                        : (1024.0f + mantissa) * std::ldexp(1.0f, exponent - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

// Uniform values in [-bound, bound].
inline void RandomFill(std::vector<float>* v, size_t n, float bound, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-bound, bound);
  v->resize(n);
  for (float& x : *v) x = u(*rng);
}

// Rounds f32 weights to values of `dtype` (MHA_DTYPE_BF16 / F16) in place and returns their
// 16-bit encodings; for MHA_DTYPE_F32 leaves the values and returns nothing.
inline std::vector<uint16_t> RoundWeights(int32_t dtype, std::vector<float>* w) {
  std::vector<uint16_t> bits;
  if (dtype == MHA_DTYPE_F32) return bits;
  bits.resize(w->size());
  for (size_t i = 0; i < w->size(); ++i) {
    bits[i] = dtype == MHA_DTYPE_BF16 ? BF16Bits((*w)[i]) : F16Bits((*w)[i]);
    (*w)[i] = dtype == MHA_DTYPE_BF16 ? FromBF16(bits[i]) : FromF16(bits[i]);
  }
  return bits;
}

}  // namespace fuzz
}  // namespace mha

#endif  // MHA_TOOLS_FUZZ_FUZZ_UTIL_H_
