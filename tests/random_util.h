// Uniform random test data, drawn in order from the caller's generator (so a test's data
// depend only on its seed and its draws).
#ifndef MHA_TESTS_RANDOM_UTIL_H_
#define MHA_TESTS_RANDOM_UTIL_H_

#include <cstddef>
#include <random>
#include <vector>

namespace mha {
namespace test {

// n floats uniform in [lo, hi).
inline std::vector<float> UniformFloats(size_t n, float lo, float hi, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(*rng);
  return v;
}

// n floats uniform in [-bound, bound).
inline std::vector<float> SymmetricFloats(size_t n, float bound, std::mt19937* rng) {
  return UniformFloats(n, -bound, bound, rng);
}

}  // namespace test
}  // namespace mha

#endif  // MHA_TESTS_RANDOM_UTIL_H_
