// The safetensors writer makes files the strict reader accepts, and the reader refuses every
// way a file can be malformed: bad header length or alignment, bad JSON, duplicate names,
// offsets that leave gaps, overlap or disagree with shape × dtype, trailing bytes.
#include <cstring>
#include <functional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "checkpoint/safetensors.h"
#include "tests/checkpoint/checkpoint_test_support.h"

namespace zest {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDirectory;

// A file from a header text (padded to 8 bytes unless `pad` is false) and a data section.
std::string file_of(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  return bytes + header + data;
}

std::string error_reading(const std::string& path) {
  try {
    SafetensorsReader reader(path);
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kData);
    return error.what();
  }
  return "no error";
}

TEST(Safetensors, WrittenFilesReadBackExactly) {
  ScratchDirectory scratch;
  const std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 7.0f};
  const std::vector<float> b = {0.5f, 0.25f};
  const std::string path = scratch.path("model.safetensors");
  write_safetensors(
      path, {{"layer0.weight", DType::kFloat32, {2, 3}}, {"layer0.bias", DType::kBFloat16, {2}}},
      {{"format", "pt"}}, [&](std::size_t i, const SafetensorsSink& write) {
        if (i == 0) {
          write(a.data(), 3 * sizeof(float));  // in two pieces
          write(a.data() + 3, 3 * sizeof(float));
        } else {
          const BFloat16 values[2] = {BFloat16(b[0]), BFloat16(b[1])};
          write(values, sizeof values);
        }
      });
  const std::string bytes = testing::read_whole_file(path);
  std::uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  EXPECT_EQ(header % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header + 6 * 4 + 2 * 2);

  const SafetensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), 2u);
  EXPECT_EQ(reader.tensors()[0].name, "layer0.weight");  // data order
  EXPECT_EQ(reader.tensors()[0].dtype, "F32");
  EXPECT_EQ(reader.tensors()[0].shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(reader.tensors()[1].dtype, "BF16");
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  EXPECT_EQ(reader.read_float32("layer0.weight"), a);
  EXPECT_EQ(reader.read_float32("layer0.bias"), b);
  EXPECT_THROW(reader.read_float32("nope"), Error);
}

TEST(Safetensors, AcceptsEmptyTensorsAndOtherDtypes) {
  ScratchDirectory scratch;
  const std::string path = scratch.path("x.safetensors");
  testing::write_whole_file(path,
                            file_of(R"({"e":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},)"
                                    R"("i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                                    std::string(8, '\1')));
  const SafetensorsReader reader(path);
  EXPECT_EQ(reader.tensors().size(), 2u);
  EXPECT_THROW(reader.read_float32("i"), Error);  // not a floating-point type
}

struct Malformed {
  const char* name;
  std::function<std::string()> bytes;
  const char* message;
};

class SafetensorsRejects : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsRejects, WithAMessageSayingWhat) {
  ScratchDirectory scratch;
  const std::string path = scratch.path("bad.safetensors");
  testing::write_whole_file(path, GetParam().bytes());
  EXPECT_THAT(error_reading(path), HasSubstr(GetParam().message));
}

const std::string kF32x2 = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsRejects,
    ::testing::Values(
        Malformed{"TooShort", [] { return std::string("abc"); }, "shorter than"},
        Malformed{"LengthPastEnd", [] { return std::string("\xff\0\0\0\0\0\0\0{}", 10); },
                  "does not fit the file"},
        Malformed{"Unaligned", [] { return file_of(kF32x2, std::string(8, '\0'), false); },
                  "not a multiple of 8"},
        Malformed{"NotJson", [] { return file_of("{\"a\": ", ""); }, "not well-formed JSON"},
        Malformed{"NotAnObject", [] { return file_of("[1, 2]", ""); }, "does not start with '{'"},
        Malformed{"Duplicate",
                  [] {
                    return file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                   R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   std::string(8, '\0'));
                  },
                  "names 'a' twice"},
        Malformed{"WrongByteLength",
                  [] {
                    return file_of(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                                   std::string(8, '\0'));
                  },
                  "spans 8 bytes; shape and dtype F32 make 12"},
        Malformed{"Gap",
                  [] {
                    return file_of(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   std::string(8, '\0'));
                  },
                  "starts at byte 4 of the data, not at 0 (gap)"},
        Malformed{"Overlap",
                  [] {
                    return file_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                   std::string(8, '\0'));
                  },
                  "(overlap)"},
        Malformed{"TrailingBytes", [] { return file_of(kF32x2, std::string(12, '\0')); },
                  "the tensors end at byte 8 of the data, which holds 12"},
        Malformed{"MissingBytes", [] { return file_of(kF32x2, std::string(4, '\0')); },
                  "which holds 4"},
        Malformed{"UnknownDtype",
                  [] {
                    return file_of(R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})",
                                   std::string(1, '\0'));
                  },
                  "unknown dtype 'F7'"},
        Malformed{"NegativeShape",
                  [] {
                    return file_of(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})",
                                   "");
                  },
                  "shape must hold non-negative integers"},
        Malformed{"ExtraKey",
                  [] {
                    return file_of(
                        R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
                        std::string(4, '\0'));
                  },
                  "unknown key 'x'"},
        Malformed{"MetadataNotStrings",
                  [] { return file_of(R"({"__metadata__":{"step":3}})", ""); },
                  "__metadata__.step is not a string"},
        // Sizes from the file are checked against the file before anything is allocated.
        Malformed{"HeaderLengthOf2To62",
                  [] { return std::string("\0\0\0\0\0\0\0\x40{}      ", 16); },
                  "header length 4611686018427387904 does not fit the file (16 bytes)"},
        Malformed{"ShapeOf2To64Elements",
                  [] {
                    return file_of(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                                   R"("data_offsets":[0,0]}})",
                                   "");
                  },
                  "tensor 'a' is too large"},
        Malformed{"OffsetsOf2To62Bytes",
                  [] {
                    return file_of(R"({"a":{"dtype":"F32","shape":[1152921504606846976],)"
                                   R"("data_offsets":[0,4611686018427387904]}})",
                                   std::string(8, '\0'));
                  },
                  "the tensors end at byte 4611686018427387904 of the data, which holds 8"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace zest
