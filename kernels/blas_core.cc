#include "kernels/blas_core.h"

#include <cblas.h>

#include <cstdlib>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define ZEST_HAVE_CPUID 1
#endif

// OpenBLAS's DYNAMIC_ARCH builds (Debian's among them) export these: quit forgets the core,
// init picks one again, reading OPENBLAS_CORETYPE. Weak, so that a build without them (another
// BLAS, a single-core OpenBLAS) links and skips the switch.
extern "C" {
[[gnu::weak]] void gotoblas_dynamic_init();
[[gnu::weak]] void gotoblas_dynamic_quit();
}

namespace zest {

CpuFeatures cpu_features() {
  CpuFeatures cpu;
#if defined(ZEST_HAVE_CPUID)
  // Note: CPUID directly rather than __builtin_cpu_supports: this runs from .preinit_array,
  // before libgcc's constructor has filled in what the builtin reads.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return cpu;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  // SSE, AVX, opmask, upper halves of ZMM0-15, ZMM16-31: all saved by the OS.
  constexpr unsigned kAvx512State = 0x2 | 0x4 | 0x20 | 0x40 | 0x80;
  if ((xcr0_low & kAvx512State) != kAvx512State) return cpu;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return cpu;
  cpu.avx512f = (ebx & bit_AVX512F) != 0;
  cpu.avx512dq = (ebx & bit_AVX512DQ) != 0;
  cpu.avx512bw = (ebx & bit_AVX512BW) != 0;
  cpu.avx512vl = (ebx & bit_AVX512VL) != 0;
  const unsigned leaves = eax;
  if (leaves >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0) {
    cpu.avx512_bf16 = (eax & (1u << 5)) != 0;
  }
#endif
  return cpu;
}

const char* preferred_openblas_core(const CpuFeatures& cpu) {
  if (!(cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl)) return nullptr;
  return cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
}

const char* choose_openblas_coretype() {
  if (const char* set = std::getenv("OPENBLAS_CORETYPE"); set != nullptr && *set != '\0') {
    return set;
  }
  const char* core = preferred_openblas_core(cpu_features());
  if (core != nullptr) setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1);
  return core;
}

std::string select_openblas_core() {
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const bool was_set = before != nullptr && *before != '\0';
  const char* chosen = choose_openblas_coretype();
  if (!was_set && chosen != nullptr && gotoblas_dynamic_init != nullptr &&
      gotoblas_dynamic_quit != nullptr) {
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
  }
  return openblas_core();
}

std::string openblas_core() {
  const char* name = openblas_get_corename();
  return name != nullptr && *name != '\0' ? name : "unknown";
}

}  // namespace zest
