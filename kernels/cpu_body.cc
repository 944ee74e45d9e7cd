#include "kernels/cpu_body.h"

#include <array>
#include <cstdlib>
#include <string>

#include "base/error.h"

#if defined(ZEST_HAVE_X86_BODIES)
#include <cpuid.h>
#endif

namespace zest {
namespace {

#if defined(ZEST_HAVE_X86_BODIES)
// Note: asked of CPUID directly, since Clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

constexpr std::array<CpuBody, 3> kWidestFirst = {CpuBody::kAvx512, CpuBody::kAvx2,
                                                 CpuBody::kPortable};

std::string supported_names() {
  std::string names;
  for (CpuBody body : kWidestFirst) {
    if (!cpu_body_supported(body)) continue;
    if (!names.empty()) names += ", ";
    names += cpu_body_name(body);
  }
  return names;
}

}  // namespace

const char* cpu_body_name(CpuBody body) {
  switch (body) {
    case CpuBody::kPortable: return "portable";
    case CpuBody::kAvx2: return "avx2";
    case CpuBody::kAvx512: return "avx512";
  }
  return "unknown";
}

bool cpu_body_supported(CpuBody body) {
  switch (body) {
    case CpuBody::kPortable: return true;
#if defined(ZEST_HAVE_X86_BODIES)
    // F16C: the fp16 copy-out converts in hardware (every AVX2 CPU has it).
    case CpuBody::kAvx2:
      return __builtin_cpu_supports("avx2") && has_f16c();
    case CpuBody::kAvx512: return __builtin_cpu_supports("avx512f");
#else
    case CpuBody::kAvx2:
    case CpuBody::kAvx512: return false;
#endif
  }
  return false;
}

CpuBody choose_cpu_body(const char* requested) {
  if (requested == nullptr || *requested == '\0') {
    for (CpuBody body : kWidestFirst) {
      if (cpu_body_supported(body)) return body;
    }
    return CpuBody::kPortable;
  }
  const std::string name = requested;
  for (CpuBody body : kWidestFirst) {
    if (name != cpu_body_name(body)) continue;
    if (cpu_body_supported(body)) return body;
    throw Error(ErrorKind::kConfig, "ZEST_CPU_KERNEL=" + name +
                                        ": this CPU or build cannot run it (supported: " +
                                        supported_names() + ")");
  }
  throw Error(ErrorKind::kConfig, "ZEST_CPU_KERNEL=" + name +
                                      ": unknown body (allowed: portable, avx2, avx512)");
}

CpuBody selected_cpu_body() {
  static const CpuBody body = choose_cpu_body(std::getenv("ZEST_CPU_KERNEL"));
  return body;
}

}  // namespace zest
