#include "reshard/format/safetensors_writer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/unit/format/safetensors_golden.h"
#include "tests/unit/hex.h"

namespace reshard::format {
namespace {

using reshard::testing::FromHex;

using view::Segment;

uint8_t PatternByte(uint32_t record, uint64_t offset) {
  return static_cast<uint8_t>(record * 29 + offset * 5 + 1);
}

Status PatternFill(uint32_t record, uint64_t offset, uint8_t* out, size_t length) {
  for (size_t k = 0; k < length; ++k) out[k] = PatternByte(record, offset + k);
  return Status::Ok();
}

// The JSON text of the header, without the length prefix and trailing padding.
std::string HeaderJson(const SafetensorsLayout& layout) {
  const std::string blob = layout.file.blobs()[0].ToString().value();
  std::string json = blob.substr(8, layout.header_size);
  while (!json.empty() && json.back() == ' ') json.pop_back();
  return json;
}

TEST_CASE("LayoutSafetensors: reproduces the official writer's bytes", "[format]") {
  const std::string golden = reshard::testing::OfficialSafetensorsFile();
  const std::vector<std::string> data = {FromHex("0000803f000000c0"), FromHex("803f00404040"),
                                         FromHex("01")};
  auto layout = LayoutSafetensors({{"w", DType::kFloat32, {2}},
                                   {"b", DType::kBFloat16, {3}},
                                   {"m", DType::kBool, {1}}});
  REQUIRE(layout.ok());
  auto fill = [&](uint32_t record, uint64_t offset, uint8_t* out, size_t length) -> Status {
    data[record].copy(reinterpret_cast<char*>(out), length, offset);
    return Status::Ok();
  };
  auto bytes = view::ReadAll(layout->file, fill);
  REQUIRE(bytes.ok());
  CHECK(*bytes == golden);
  CHECK(layout->header_size == 200);
  CHECK(layout->data_start == 208);
  CHECK(layout->file_size == golden.size());
  CHECK(layout->data_offsets == std::vector<uint64_t>{208, 216, 222});
  CHECK(layout->byte_sizes == std::vector<uint64_t>{8, 6, 1});
  CHECK(layout->file_order == std::vector<uint32_t>{0, 1, 2});
}

TEST_CASE("LayoutSafetensors: header content, padding and exact size", "[format]") {
  const std::vector<SafetensorsTensor> tensors = {{"b", DType::kFloat32, {2, 3}},
                                                  {"a", DType::kBFloat16, {4}},
                                                  {"c", DType::kInt64, {}},
                                                  {"e", DType::kFloat16, {0, 7}}};
  auto layout = LayoutSafetensors(tensors);
  REQUIRE(layout.ok());
  CHECK(HeaderJson(*layout) ==
        R"({"__metadata__":{"format":"pt"},)"
        R"("c":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
        R"("b":{"dtype":"F32","shape":[2,3],"data_offsets":[8,32]},)"
        R"("a":{"dtype":"BF16","shape":[4],"data_offsets":[32,40]},)"
        R"("e":{"dtype":"F16","shape":[0,7],"data_offsets":[40,40]}})");
  const std::string blob = layout->file.blobs()[0].ToString().value();
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<uint8_t>(blob[k]);
  CHECK(n == layout->header_size);
  CHECK(layout->header_size % 8 == 0);
  CHECK(layout->header_size - HeaderJson(*layout).size() < 8);
  CHECK(layout->data_start == 8 + layout->header_size);
  CHECK(layout->file_size == layout->data_start + 40);
  CHECK(layout->file.size() == layout->file_size);
  CHECK(layout->data_offsets ==
        std::vector<uint64_t>{layout->data_start + 8, layout->data_start + 32,
                              layout->data_start, layout->data_start + 40});
  CHECK(layout->file_order == std::vector<uint32_t>{2, 0, 1, 3});
  // Segments: the header, then one data segment per non-empty tensor, by input index.
  const std::vector<Segment>& segments = layout->file.segments();
  REQUIRE(segments.size() == 4);
  CHECK(segments[0].kind == Segment::Kind::kInline);
  CHECK(segments[0].length == layout->data_start);
  CHECK(segments[1].index == 2);
  CHECK(segments[2].index == 0);
  CHECK(segments[3].index == 1);
  for (size_t i = 1; i < segments.size(); ++i) {
    CHECK(segments[i].kind == Segment::Kind::kData);
    CHECK(segments[i].source_offset == 0);
    CHECK(segments[i].offset == layout->data_offsets[segments[i].index]);
  }
}

TEST_CASE("LayoutSafetensors: orders by dtype rank, then name, and aligns naturally",
          "[format]") {
  std::vector<SafetensorsTensor> tensors;
  const std::vector<DType> dtypes = {
      DType::kBool,       DType::kUInt8,         DType::kInt8,          DType::kFloat8E5M2,
      DType::kFloat8E4M3FN, DType::kFloat8E8M0FNU, DType::kInt16,       DType::kUInt16,
      DType::kFloat16,    DType::kBFloat16,      DType::kInt32,         DType::kUInt32,
      DType::kFloat32,    DType::kComplex64,     DType::kFloat64,       DType::kInt64,
      DType::kUInt64};
  for (const DType d : dtypes) {
    tensors.push_back({"z" + std::string(Info(d).torch_name), d, {3}});
    tensors.push_back({"a" + std::string(Info(d).torch_name), d, {1}});
  }
  auto layout = LayoutSafetensors(tensors, {});
  REQUIRE(layout.ok());
  std::vector<std::string> order;
  for (const uint32_t i : layout->file_order) order.push_back(tensors[i].name);
  CHECK(order == std::vector<std::string>{
                     "auint64", "zuint64", "aint64", "zint64", "afloat64", "zfloat64",
                     "acomplex64", "zcomplex64", "afloat32", "zfloat32", "auint32", "zuint32",
                     "aint32", "zint32", "abfloat16", "zbfloat16", "afloat16", "zfloat16",
                     "auint16", "zuint16", "aint16", "zint16", "afloat8_e8m0fnu",
                     "zfloat8_e8m0fnu", "afloat8_e4m3fn", "zfloat8_e4m3fn", "afloat8_e5m2",
                     "zfloat8_e5m2", "aint8", "zint8", "auint8", "zuint8", "abool", "zbool"});
  CHECK(layout->data_start % 8 == 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    CHECK(layout->data_offsets[i] % ItemSize(tensors[i].dtype) == 0);
  }
  // Empty metadata: no "__metadata__" key at all.
  CHECK(HeaderJson(*layout).rfind(R"({"auint64":)", 0) == 0);
}

TEST_CASE("LayoutSafetensors: data round-trips through the parsed header", "[format]") {
  const std::vector<SafetensorsTensor> tensors = {{"layers.0.w", DType::kFloat32, {16, 8}},
                                                  {"layers.0.b", DType::kFloat32, {8}},
                                                  {"emb", DType::kBFloat16, {5, 3}},
                                                  {"mask", DType::kBool, {7}},
                                                  {"step", DType::kInt64, {}}};
  auto layout = LayoutSafetensors(tensors, {{"format", "pt"}, {"origin", "reshardfs"}});
  REQUIRE(layout.ok());
  auto bytes = view::ReadAll(layout->file, PatternFill);
  REQUIRE(bytes.ok());
  const auto header = nlohmann::json::parse(HeaderJson(*layout));
  CHECK(header["__metadata__"] == nlohmann::json({{"format", "pt"}, {"origin", "reshardfs"}}));
  uint64_t end = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& entry = header[tensors[i].name];
    CHECK(entry["dtype"] == std::string(Info(tensors[i].dtype).safetensors));
    CHECK(entry["shape"].get<std::vector<int64_t>>() == tensors[i].shape);
    const auto begin_end = entry["data_offsets"].get<std::vector<uint64_t>>();
    CHECK(layout->data_start + begin_end[0] == layout->data_offsets[i]);
    CHECK(begin_end[1] - begin_end[0] == layout->byte_sizes[i]);
    end = std::max<uint64_t>(end, begin_end[1]);
    for (uint64_t k = 0; k < layout->byte_sizes[i]; ++k) {
      REQUIRE(static_cast<uint8_t>((*bytes)[layout->data_offsets[i] + k]) ==
              PatternByte(static_cast<uint32_t>(i), k));
    }
  }
  CHECK(layout->data_start + end == bytes->size());
}

TEST_CASE("LayoutSafetensors: names are escaped like serde_json", "[format]") {
  auto layout = LayoutSafetensors({{"q\"\\\n\x01/\xc3\xa9", DType::kUInt8, {1}}}, {});
  REQUIRE(layout.ok());
  CHECK(HeaderJson(*layout) ==
        "{\"q\\\"\\\\\\n\\u0001/\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[1],"
        "\"data_offsets\":[0,1]}}");
}

TEST_CASE("LayoutSafetensors: no tensors", "[format]") {
  auto bare = LayoutSafetensors({}, {});
  REQUIRE(bare.ok());
  CHECK(*view::ReadAll(bare->file, PatternFill) == std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  auto with_metadata = LayoutSafetensors({});
  REQUIRE(with_metadata.ok());
  CHECK(HeaderJson(*with_metadata) == R"({"__metadata__":{"format":"pt"}})");
  CHECK(with_metadata->file_size == with_metadata->data_start);
}

TEST_CASE("LayoutSafetensors: refusals", "[format]") {
  auto refuses = [](const std::vector<SafetensorsTensor>& tensors, StatusCode code,
                    const std::string& needle,
                    const std::map<std::string, std::string>& metadata = {}) {
    auto r = LayoutSafetensors(tensors, metadata);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == code);
    CHECK_THAT(r.status().message(), Catch::Contains(needle));
  };
  refuses({{"c", DType::kComplex128, {2}}}, StatusCode::kUnsupported,
          "tensor 0 'c': dtype complex128 has no safetensors code");
  refuses({{"x", DType::kFloat32, {1}}, {"x", DType::kInt8, {1}}}, StatusCode::kInvalidArgument,
          "tensor 1 'x': duplicate name");
  refuses({{"", DType::kFloat32, {1}}}, StatusCode::kInvalidArgument, "tensor 0 has no name");
  refuses({{"__metadata__", DType::kFloat32, {1}}}, StatusCode::kInvalidArgument, "reserved");
  refuses({{"bad\xff", DType::kFloat32, {1}}}, StatusCode::kInvalidArgument, "not valid UTF-8");
  refuses({{"surrogate\xed\xa0\x80", DType::kFloat32, {1}}}, StatusCode::kInvalidArgument,
          "not valid UTF-8");
  refuses({{"overlong\xc0\xaf", DType::kFloat32, {1}}}, StatusCode::kInvalidArgument,
          "not valid UTF-8");
  refuses({{"x", DType::kFloat32, {2, -1}}}, StatusCode::kInvalidArgument,
          "negative dimension -1");
  refuses({{"x", DType::kFloat32, {int64_t{1} << 40, int64_t{1} << 40}}},
          StatusCode::kInvalidArgument, "numel * itemsize overflows 64 bits");
  refuses({{"x", DType::kUInt8, {INT64_MAX}}, {"y", DType::kUInt8, {INT64_MAX}},
           {"z", DType::kUInt8, {2}}},
          StatusCode::kInvalidArgument, "data offsets pass UINT64_MAX");
  refuses({}, StatusCode::kInvalidArgument, "metadata entry 'k' is not valid UTF-8",
          {{"k", "\xfe"}});
}

}  // namespace
}  // namespace reshard::format
