#include "optim/optimizer.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "base/error.h"
#include "kernels/convert.h"
#include "optim/adamw.h"
#include "optim/sgd.h"

namespace zest {
namespace {

constexpr std::array<const char*, 3> kOptimizerTypes = {"AdamW", "Adam", "SGD"};

bool equal_ignoring_case(const std::string& a, const std::string& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

// The canonical spelling of `type` (DeepSpeed accepts "adamw" as well as "AdamW"); throws for
// an unknown type, listing the allowed ones.
std::string canonical_type(const std::string& type) {
  for (const char* known : kOptimizerTypes) {
    if (equal_ignoring_case(type, known)) return known;
  }
  throw Error(ErrorKind::kConfig,
              "optimizer.type: unknown optimizer '" + type + "' (allowed: AdamW, Adam, SGD)");
}

}  // namespace

void Optimizer::update_and_round(Stream& stream, float* params, const float* grads,
                                 const std::vector<float*>& state, std::size_t count,
                                 const UpdateArgs& args, void* rounded, DType rounded_dtype) const {
  update(stream, params, grads, state, count, args);
  convert(stream, params, DType::kFloat32, rounded, rounded_dtype, count);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options) {
  const std::string type = canonical_type(options.type);
  if (type == "AdamW") return std::make_unique<AdamW>(options);
  if (type == "Adam") return std::make_unique<Adam>(options);
  return std::make_unique<Sgd>(options);
}

}  // namespace zest
