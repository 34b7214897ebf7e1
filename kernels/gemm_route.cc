#include "kernels/gemm_route.h"

#include "kernels/gemm.h"
#include "kernels/gemm_direct.h"
#include "kernels/targets.h"

namespace mha {
namespace kernels {

namespace {

// Rows up to which the direct kernel beats BLIS's with a packed a.
size_t DirectMaxRows() { return ActiveTargetIsAvx512() ? ~size_t{0} : kDirectMaxRowsBelowAvx512; }

// The direct kernel runs and beats BLIS's at every size, and BLIS's kernel stores row-major C
// tiles (the driver keeps its operands): the blocked driver and weights packed once per call
// take it. Only there: elsewhere a 16-bit layer's driver runs BLIS's kernel, whose bits the
// direct kernel's match only with FMA, and the f32 twin must compute the same bits.
bool DirectEverywhere() {
  return DirectKernelRuns() && ActiveTargetIsAvx512() && GemmBlocking().prefers_rows;
}

}  // namespace

bool DirectKernelRuns() { return GemmDirectSupported(); }

bool WeightsPrepackable(DType weight_type) {
  return weight_type == DType::kF32 && GemmBlocking().prefers_rows;
}

size_t PrepackedMinRows() { return DirectKernelRuns() ? 1 : kBlisPrepackedMinRows; }

bool StrassenPacks(size_t in, size_t out) {
  const size_t nr = GemmBlocking().nr;
  return in >= kStrassenMinDepth && in % 2 == 0 && out >= kStrassenMinCols && out % (2 * nr) == 0 &&
         GemmBlocking().prefers_rows && DirectKernelRuns();
}

GemmRoute ChooseGemmRoute(const GemmShape& s) {
  switch (s.b_packing) {
    case BPacking::kBf16:
      return GemmRoute::kBf16PackedB;  // the layer's arithmetic, not a speed choice
    case BPacking::kStrassen:
      if (s.rows >= kStrassenMinRows && DirectKernelRuns()) return GemmRoute::kStrassenPackedB;
      [[fallthrough]];
    case BPacking::kPrepacked:
      if (s.rows >= PrepackedMinRows()) {
        return DirectKernelRuns() && s.rows <= DirectMaxRows() ? GemmRoute::kDirectPackedB
                                                               : GemmRoute::kBlisPackedB;
      }
      break;  // too few rows for the packing: the weights as stored
    case BPacking::kOncePerCall:
      return DirectEverywhere() ? GemmRoute::kDirectPackedB : GemmRoute::kBlisPackedB;
    case BPacking::kNone:
      break;
  }
  if (s.rows <= kGemvMaxRows && s.gemv_layout) return GemmRoute::kGemv;
  return DirectEverywhere() ? GemmRoute::kDirectPackB : GemmRoute::kBlisPackAB;
}

}  // namespace kernels
}  // namespace mha
