// Uses an installed zest the way a library user would: the umbrella header, an Error and the
// dtype table. Exits 0 only when every value is right.
#include <zest/zest.h>

#include <cstdio>
#include <string>

int main() {
  int failures = 0;
  auto expect = [&failures](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "zest_consumer: wrong %s\n", what);
      ++failures;
    }
  };

  zest::Error error(zest::ErrorKind::kConfig, "optimizer.lr: must be positive");
  expect(error.kind() == zest::ErrorKind::kConfig, "Error::kind");
  expect(std::string(error.what()) == "optimizer.lr: must be positive", "Error::what");
  expect(zest::is_input_error(error.kind()), "is_input_error");

  expect(zest::dtype_size(zest::DType::kFloat32) == 4, "dtype_size(fp32)");
  expect(zest::dtype_size(zest::DType::kBFloat16) == 2, "dtype_size(bf16)");
  expect(zest::parse_dtype("bf16") == zest::DType::kBFloat16, "parse_dtype(bf16)");
  expect(static_cast<float>(zest::BFloat16(1.0f)) == 1.0f, "BFloat16 round trip");

  if (failures == 0) std::printf("zest_consumer: ok\n");
  return failures == 0 ? 0 : 1;
}
