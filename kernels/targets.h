// Which Highway targets (instruction sets) the kernels were compiled for, which one runs, and a
// way for tests and tools to restrict dispatch to one target.
#ifndef MHA_KERNELS_TARGETS_H_
#define MHA_KERNELS_TARGETS_H_

#include <cstdint>
#include <vector>

namespace mha {
namespace kernels {

// Targets compiled into mha that this CPU supports, best first (Highway target bits).
std::vector<int64_t> SupportedTargets();
// Highway's name of a target ("AVX3_DL", "AVX2", "NEON", "SVE", "EMU128", ...).
const char* TargetName(int64_t target);
// The target dynamic dispatch currently selects.
int64_t ActiveTarget();
// Restricts dispatch to `target` (must be in SupportedTargets()); 0 restores the default.
// Affects the whole process: for tests and benchmarks, not for concurrent use.
void ForceTarget(int64_t target);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_TARGETS_H_
