// CPU feature checks (cpu_features.h).
#include "kernels/cpu_features.h"

#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)  // Linux arch/arm64 uapi hwcap.h
#endif
#endif

namespace mha {
namespace kernels {

#if defined(__x86_64__)
namespace {

// CPUID leaf 7, sub-leaf `sub`, as {eax, ebx, ecx, edx}; all zero where the CPU lacks the leaf.
struct Leaf {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};
Leaf Leaf7(unsigned sub) {
  Leaf l;
  if (!__get_cpuid_count(7, sub, &l.eax, &l.ebx, &l.ecx, &l.edx)) return Leaf{};
  return l;
}

// Whether the OS saves every state component in `mask` (XCR0, read by XGETBV once CPUID says
// OSXSAVE).
bool OsSaves(uint64_t mask) {
  uint32_t eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return false;  // OSXSAVE
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(edx) << 32) | eax;
  return (xcr0 & mask) == mask;
}

bool AllOf(uint32_t bits, uint32_t need) { return (bits & need) == need; }

}  // namespace

bool CpuHasAvx2() { return OsSaves(0x6) && AllOf(Leaf7(0).ebx, 1u << 5); }  // SSE, AVX state

bool CpuHasAvx512() {
  // XCR0 bits 1, 2 (SSE, AVX), 5, 6, 7 (opmask, upper zmm, zmm16-31); F, DQ, BW, VL.
  return OsSaves(0xE6) && AllOf(Leaf7(0).ebx, (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31));
}

bool CpuHasAvx512Vnni() { return CpuHasAvx512() && AllOf(Leaf7(0).ecx, 1u << 11); }

bool CpuHasAvx512Bf16() { return CpuHasAvx512() && AllOf(Leaf7(1).eax, 1u << 5); }

bool CpuHasAmx() {
  // EDX bits 22 (AMX-BF16) and 24 (AMX-TILE); XCR0 bits 17, 18 (TILECFG, TILEDATA).
  return CpuHasAvx512() && AllOf(Leaf7(0).edx, (1u << 22) | (1u << 24)) &&
         OsSaves((1ull << 17) | (1ull << 18));
}
#else
bool CpuHasAvx2() { return false; }
bool CpuHasAvx512() { return false; }
bool CpuHasAvx512Vnni() { return false; }
bool CpuHasAvx512Bf16() { return false; }
bool CpuHasAmx() { return false; }
#endif

bool CpuHasArmBf16() {
#if defined(__aarch64__) && defined(__linux__) && defined(HWCAP2_BF16)
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#else
  return false;
#endif
}

bool CpuHasArmDotProd() {
#if defined(__aarch64__) && defined(__linux__)
  return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
  return false;
#endif
}

}  // namespace kernels
}  // namespace mha
