// What the CPU and its OS offer beyond the library's baseline (x86-64, armv8-a), for the per-ISA
// kernels Highway 1.0.3 does not reach (gemm_bf16_*.cc, gemv_int8_*.cc): each is called only
// where its function here says yes. x86-64: CPUID and the register state the OS saves (XCR0);
// aarch64 Linux: the auxiliary vector's HWCAP bits; false everywhere else. Each call queries the
// CPU: callers keep the answer (a function-local static).
#ifndef MHA_KERNELS_CPU_FEATURES_H_
#define MHA_KERNELS_CPU_FEATURES_H_

namespace mha {
namespace kernels {

// AVX2 (and FMA's ymm state): the ymm registers saved.
bool CpuHasAvx2();
// AVX-512 F, DQ, BW and VL, the opmask and zmm state saved.
bool CpuHasAvx512();
// CpuHasAvx512() and AVX512_VNNI (VPDPBUSD).
bool CpuHasAvx512Vnni();
// CpuHasAvx512() and AVX512_BF16 (VDPBF16PS).
bool CpuHasAvx512Bf16();
// AMX-TILE and AMX-BF16 with the tile state saved, and CpuHasAvx512() (the AMX kernel's
// epilogue). The OS may still refuse the tiles to the process (gemm_bf16.cc asks it).
bool CpuHasAmx();
// Arm FEAT_BF16 (BFMMLA, BFDOT).
bool CpuHasArmBf16();
// Arm FEAT_DotProd (SDOT, UDOT).
bool CpuHasArmDotProd();

}  // namespace kernels
}  // namespace mha

#endif  // MHA_KERNELS_CPU_FEATURES_H_
