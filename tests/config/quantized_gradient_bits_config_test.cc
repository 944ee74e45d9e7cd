// zest's zero_optimization.zero_quantized_gradients_bits: qgZ's int8 (8, the default) or int4
// (4) blocks; the default in the resolved config (what --print-config shows), the value reaching
// the engine, and a one-line error naming the key for anything but 8 or 4.
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "config/train_config.h"
#include "tests/config/stage3_config.h"

namespace zest {
namespace {

using nlohmann::json;

json base_config() {
  json config = testing::stage3_mlp_config();
  config["zero_optimization"]["zero_quantized_gradients"] = true;
  return config;
}

TEST(QuantizedGradientBitsConfig, EightByDefaultAndShownInTheResolvedConfig) {
  const TrainConfig plain = parse_train_config(base_config(), {});
  EXPECT_EQ(plain.engine.quantized_gradient_bits, 8);
  EXPECT_EQ(plain.json["zero_optimization"]["zero_quantized_gradients_bits"], 8);
}

TEST(QuantizedGradientBitsConfig, FourReachesTheEngine) {
  json config = base_config();
  config["zero_optimization"]["zero_quantized_gradients_bits"] = 4;
  const TrainConfig parsed = parse_train_config(config, {});
  EXPECT_EQ(parsed.engine.quantized_gradient_bits, 4);
  EXPECT_EQ(parsed.json["zero_optimization"]["zero_quantized_gradients_bits"], 4);
  config["zero_optimization"]["zero_quantized_gradients_bits"] = 8.0;  // JSON's 8 too
  EXPECT_EQ(parse_train_config(config, {}).engine.quantized_gradient_bits, 8);
}

TEST(QuantizedGradientBitsConfig, AnythingButEightOrFourIsOneLineNamingTheKey) {
  const std::string key = "zero_optimization.zero_quantized_gradients_bits: must be 8 or 4, got ";
  const std::vector<std::pair<json, std::string>> cases = {
      {json(5), "5"},           {json(0), "0"},           {json(-4), "-4"},
      {json(16), "16"},         {json(4.5), "4.5"},       {json("4"), "string \"4\""},
      {json(true), "boolean true"}, {json(nullptr), "null"}, {json::array({4}), "array [4]"}};
  for (const auto& [value, shown] : cases) {
    SCOPED_TRACE(value.dump());
    json config = base_config();
    config["zero_optimization"]["zero_quantized_gradients_bits"] = value;
    try {
      parse_train_config(config, {});
      ADD_FAILURE() << "accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kConfig);
      EXPECT_EQ(std::string(error.what()), key + shown);
    }
  }
}

TEST(QuantizedGradientBitsConfig, ReadWithoutQuantizedGradientsToo) {
  json config = base_config();
  config["zero_optimization"]["zero_quantized_gradients"] = false;
  config["zero_optimization"]["zero_quantized_gradients_bits"] = 4;
  EXPECT_EQ(parse_train_config(config, {}).engine.quantized_gradient_bits, 4);
  config["zero_optimization"]["zero_quantized_gradients_bits"] = 3;
  EXPECT_THROW(parse_train_config(config, {}), Error);
}

}  // namespace
}  // namespace zest
