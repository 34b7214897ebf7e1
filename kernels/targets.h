// Which Highway targets (instruction sets) the kernels were compiled for, which one runs, and a
// way for tests and tools to restrict dispatch to one target.
#ifndef MHA_KERNELS_TARGETS_H_
#define MHA_KERNELS_TARGETS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace mha {
namespace kernels {

// Targets compiled into mha that this CPU supports, best first (Highway target bits).
std::vector<int64_t> SupportedTargets();
// Highway's name of a target ("AVX3_DL", "AVX2", "NEON", "SVE", "EMU128", ...).
const char* TargetName(int64_t target);
// The target dynamic dispatch currently selects.
int64_t ActiveTarget();
// Whether ActiveTarget() is an x86 AVX-512 one (32 vector registers: the direct GEMM kernel's
// 6 x 4 tiles).
bool ActiveTargetIsAvx512();
// Restricts dispatch to `target` (must be in SupportedTargets()); 0 restores the default.
// Affects the whole process: for tests and benchmarks, not for concurrent use.
void ForceTarget(int64_t target);

// A counter that ForceTarget and ForceBf16Kernel advance: a plan made before a different value
// may have chosen kernels the process no longer dispatches (the plan caches' key).
uint64_t DispatchEpoch();
void AdvanceDispatchEpoch();

// The supported target whose Highway name is `name` (case-insensitive), or 0.
int64_t SupportedTargetByName(const char* name);

// The environment variable MHA_TARGETS=NAME (e.g. AVX2 on an AVX-512 CPU, to measure the AVX2
// paths), a developer's override: it restricts dispatch to that one target for the whole process.
// Read once, at the first call of this function, which ActiveTarget, BLIS's first use
// (gemm.cc), Context::Create and MultiheadAttention::Create make; never at load. On x86 a target
// below AVX3 also asks BLIS for its AVX2 kernels (BLIS_ARCH_TYPE, unless the variable is already
// set; SelectBlisAvx2ConfigurationThroughEnvironment in targets.cc says why that takes an
// environment variable), so every kernel runs its AVX2 code. Returns the restriction applied (""
// when MHA_TARGETS is unset) or, for a name that is not a compiled and supported target, an
// error message naming it and the supported ones (nothing is changed then; the message is also
// printed once on stderr).
const std::string& TargetsFromEnvironment();

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_TARGETS_H_
