// Choosing a CPU kernel body: the widest this CPU supports by default, a named one on request
// (ZEST_CPU_KERNEL), and a kConfig Error naming the variable for a body that is unknown or that
// this CPU or build cannot run.
#include "kernels/cpu_body.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "base/error.h"

namespace zest {
namespace {

constexpr CpuBody kBodies[] = {CpuBody::kPortable, CpuBody::kAvx2, CpuBody::kAvx512};

std::string config_error_of(const char* requested) {
  try {
    choose_cpu_body(requested);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kConfig);
    return error.what();
  }
  ADD_FAILURE() << "expected an Error for " << requested;
  return "";
}

TEST(CpuBody, ThePortableBodyIsAlwaysSupported) {
  EXPECT_TRUE(cpu_body_supported(CpuBody::kPortable));
  EXPECT_EQ(choose_cpu_body("portable"), CpuBody::kPortable);
}

TEST(CpuBody, WithoutARequestTheWidestSupportedBodyIsChosen) {
  CpuBody widest = CpuBody::kPortable;
  for (CpuBody body : kBodies) {
    if (cpu_body_supported(body)) widest = body;
  }
  EXPECT_EQ(choose_cpu_body(nullptr), widest);
  EXPECT_EQ(choose_cpu_body(""), widest);
}

TEST(CpuBody, ANamedBodyIsChosenWhereSupportedAndRefusedWhereNot) {
  for (CpuBody body : kBodies) {
    SCOPED_TRACE(cpu_body_name(body));
    if (cpu_body_supported(body)) {
      EXPECT_EQ(choose_cpu_body(cpu_body_name(body)), body);
    } else {
      EXPECT_NE(config_error_of(cpu_body_name(body)).find("cannot run it (supported: "),
                std::string::npos);
    }
  }
}

TEST(CpuBody, AnUnknownNameIsAConfigErrorListingTheBodies) {
  EXPECT_EQ(config_error_of("sse"),
            "ZEST_CPU_KERNEL=sse: unknown body (allowed: portable, avx2, avx512)");
}

TEST(CpuBody, TheSelectedBodyFollowsTheEnvironment) {
  EXPECT_EQ(selected_cpu_body(), choose_cpu_body(std::getenv("ZEST_CPU_KERNEL")));
}

}  // namespace
}  // namespace zest
