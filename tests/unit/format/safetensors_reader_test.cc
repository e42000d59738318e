#include "reshard/format/safetensors_reader.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "tests/unit/format/safetensors_golden.h"
#include "tests/unit/hex.h"

namespace reshard::format {
namespace {

using reshard::testing::FromHex;

// A safetensors prefix: the little-endian length, then `json` padded with spaces to a multiple of 8.
std::string Prefix(std::string json) {
  while (json.size() % 8 != 0) json += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json;
}

TEST_CASE("ParseSafetensorsHeader: reads the official writer's file", "[format]") {
  const std::string file = reshard::testing::OfficialSafetensorsFile();
  auto header = ParseSafetensorsHeader(file, file.size());
  REQUIRE(header.ok());
  CHECK(header->data_start == 8 + 0xc8);
  REQUIRE(header->tensors.size() == 3);
  CHECK(header->tensors[0].name == "w");
  CHECK(header->tensors[0].dtype == DType::kFloat32);
  CHECK(header->tensors[0].shape == std::vector<int64_t>{2});
  CHECK(header->tensors[1].name == "b");
  CHECK(header->tensors[1].begin == 8);
  CHECK(header->tensors[1].end == 14);
  CHECK(header->tensors[2].dtype == DType::kBool);
}

TEST_CASE("ParseSafetensorsHeader: refuses what a safetensors reader refuses", "[format]") {
  const std::string two = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string good = Prefix("{" + two + R"(,"b":{"dtype":"F16","shape":[],"data_offsets":[8,10]}})");
  REQUIRE(ParseSafetensorsHeader(good, good.size() + 10).ok());

  struct Case {
    const char* what;
    std::string prefix;
    uint64_t file_size;
    const char* message;
  };
  const Case cases[] = {
      {"short prefix", std::string(5, '\0'), 5, "shorter than its 8-byte length prefix"},
      {"header past the file", good, good.size() - 1, "runs past the file"},
      {"huge header", FromHex("0000000000000001"), 1u << 30, "above the 100000000 readers accept"},
      {"not JSON", Prefix("{nope"), 64, "not a JSON object"},
      {"a list", Prefix("[]"), 64, "not a JSON object"},
      {"a file longer than its tensors", good, good.size() + 11, "the tensors end at 10 but the byte buffer holds 11"},
      {"a hole", Prefix("{" + two + R"(,"b":{"dtype":"F16","shape":[],"data_offsets":[9,11]}})"), 0,
       "'b': starts at 9, not at 8"},
      {"an overlap", Prefix("{" + two + R"(,"b":{"dtype":"F16","shape":[],"data_offsets":[6,8]}})"), 0,
       "starts at 6, not at 8"},
      {"a length that is not numel * itemsize", Prefix(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"),
       0, "do not hold its 3 elements"},
      {"unknown dtype", Prefix(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})"), 0, "unknown dtype F33"},
      {"negative dim", Prefix(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"), 0,
       "not a non-negative integer"},
      {"overflowing shape",
       Prefix(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})"), 0,
       "shape overflows"},
      {"missing offsets", Prefix(R"({"a":{"dtype":"F32","shape":[2]}})"), 0,
       "needs exactly dtype, shape and data_offsets"},
      {"metadata of numbers", Prefix(R"({"__metadata__":{"format":1}})"), 0, "__metadata__ is not a map of strings"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const uint64_t size = c.file_size != 0 ? c.file_size : c.prefix.size() + 8;
    auto header = ParseSafetensorsHeader(c.prefix, size);
    REQUIRE_FALSE(header.ok());
    CHECK(header.status().code() == StatusCode::kCorrupt);
    CHECK_THAT(header.status().message(), Catch::Contains(c.message));
  }
}

}  // namespace
}  // namespace reshard::format
