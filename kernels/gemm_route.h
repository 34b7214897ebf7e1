// Which kernel multiplies a product by a weight matrix: the one GEMM policy. Every caller that
// chooses between GEMV, the blocked driver, BLIS's micro-kernel, mha's direct micro-kernel and
// Strassen asks ChooseGemmRoute (kernels/gemm.cc's driver, runtime/parallel_gemm.cc, the
// attention core through the predicates below); every threshold lives here. The measurement
// behind each threshold is in kernels/README.md ("Which product runs where").
//
// Names say what is packed before the micro-kernel runs and which micro-kernel runs:
// "Blis" is BLIS's micro-kernel (a packed into MR-tall micro-panels), "Direct" is mha's
// (gemm_direct.h: a read where it lies); "PackAB" packs both operands per block inside the call,
// "PackB" packs b per block and reads a in place, "PackedB" takes a b packed beforehand.
#ifndef MHA_KERNELS_GEMM_ROUTE_H_
#define MHA_KERNELS_GEMM_ROUTE_H_

#include <cstddef>
#include <cstdint>

#include "mha/types.hpp"

namespace mha {
namespace kernels {

enum class GemmRoute : uint8_t {
  kGemv,             // Gemv / GemvHalf: b's columns (w's rows) streamed once, nothing packed
  kBlisPackAB,       // Gemm / GemmHalfB driver: a and b packed per block, BLIS's micro-kernel
  kDirectPackB,      // Gemm / GemmHalfB driver: b packed per block, a in place, direct kernel
  kBlisPackedB,      // GemmBlisPackedB: b packed beforehand, a packed per call, BLIS's kernel
  kDirectPackedB,    // GemmDirectPackedB: b packed beforehand, a in place, direct kernel
  kStrassenPackedB,  // GemmStrassenPackedB: b's seven Strassen operands packed beforehand
  kBf16PackedB,      // GemmBf16PackedB: b packed as bf16 (Compute::kBF16), a rounded per call
};

// How the b operand (the weights) of a product is stored when the product starts.
enum class BPacking : uint8_t {
  kNone,         // as stored (f32, bf16 or f16): the product packs or streams it itself
  kOncePerCall,  // f32, packed once by ParallelGemm for all of its row panels
  kPrepacked,    // f32, packed at layer creation (WeightPrepack::kOn)
  kStrassen,     // kPrepacked, plus its Strassen operands (WeightPrepack::kStrassen)
  kBf16,         // packed as bf16 at layer creation (Compute::kBF16): every product takes it
};

// A product c [rows, cols] = a [rows, depth] * b [depth, cols].
struct GemmShape {
  size_t rows = 0;
  size_t cols = 0;
  size_t depth = 0;
  DType b_type = DType::kF32;  // kF32, kBF16 or kF16
  BPacking b_packing = BPacking::kNone;
  // a's rows and b's columns are contiguous (a.col_stride == 1, b.row_stride == 1: b = w^T of a
  // row-major nn.Linear weight), the layout Gemv reads.
  bool gemv_layout = true;
};

// The route of a product on this process's dispatched target and BLIS configuration. Depends
// on the shape and those two only (never on threads or data), so a partition that gives every
// piece the product's route keeps the product's bits.
GemmRoute ChooseGemmRoute(const GemmShape& shape);

// Rows up to which a product by weights as stored takes the GEMV route.
inline constexpr size_t kGemvMaxRows = 16;

// Rows up to which the direct kernel beats BLIS's with a packed a on targets below AVX-512
// (on AVX-512 it wins at every size).
inline constexpr size_t kDirectMaxRowsBelowAvx512 = 128;

// Rows from which prepacked weights are used when the direct kernel cannot run: above the GEMV
// route's rows (where it can run, from 1 row).
inline constexpr size_t kBlisPrepackedMinRows = kGemvMaxRows + 1;

// Strassen (opt-in): weights of at least kStrassenMinDepth inputs and kStrassenMinCols outputs
// get operands; products of kStrassenMinRows rows or more use them.
inline constexpr size_t kStrassenMinDepth = 512;
inline constexpr size_t kStrassenMinCols = 256;
inline constexpr size_t kStrassenMinRows = 64;

// Whether mha's direct micro-kernel runs on the dispatched target with BLIS's configuration
// (gemm_direct.h, Coverage). The attention core's per-strip products over packed key blocks
// take it wherever it runs, else BLIS's kernel.
bool DirectKernelRuns();

// Whether f32 weights can be packed once at layer creation (WeightPrepack::kOn): BLIS's
// micro-kernel stores row-major C tiles itself, so packed products never swap operands.
bool WeightsPrepackable(DType weight_type);

// The fewest rows of a product that multiplies prepacked weights (1 where the direct kernel
// runs, else kBlisPrepackedMinRows): fewer take the product by the weights as stored.
size_t PrepackedMinRows();

// Whether a layer stores the Strassen operands of w^T [in, out] (WeightPrepack::kStrassen):
// depth and width as above, halves on micro-panel boundaries, the direct kernel runs.
bool StrassenPacks(size_t in, size_t out);

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_GEMM_ROUTE_H_
