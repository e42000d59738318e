#include "reshard/plan/planned_storages.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "reshard/view/dtype_convert.h"

namespace reshard::plan {
namespace {

// A source file of 40 float32 values -3.0, -2.75, ..., after 8 junk bytes.
class SourceFile {
 public:
  SourceFile() {
    char name[] = "/tmp/reshard_planned_storages_XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    path_ = name;
    std::string bytes(8, 'J');
    for (int i = 0; i < 40; ++i) {
      const float v = Value(i);
      bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  ~SourceFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }
  static float Value(int i) { return -3.0f + 0.25f * static_cast<float>(i); }

 private:
  std::string path_;
};

StoragePlan Storage(std::string key, format::DType dtype, Conversion conversion, ExtentList extents) {
  return MakeStoragePlan(std::move(key), dtype, conversion, std::move(extents));
}

std::string Fp32Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

TEST_CASE("planned storages read every byte range of every storage, across extents and storages",
          "[plan][planned_storages]") {
  SourceFile src;
  const std::vector<Source> sources = {Source{src.path(), 8, format::DType::kFloat32, 40, nullptr}};
  std::vector<StoragePlan> plans;
  // 0: rows 1..3 of columns [2, 5) of the 8x5 matrix, 2 zeros, then elements [30, 34).
  ExtentList mixed;
  AppendExtents(mixed, 0, {view::Gather::Source(7, 3, 3, 5)});
  AppendZeros(mixed, 2);
  AppendExtents(mixed, 0, {view::Gather::Source(30, 4)});
  plans.push_back(Storage("0", format::DType::kFloat32, Conversion::kCopy, mixed));
  // 1: empty.
  plans.push_back(Storage("1", format::DType::kFloat32, Conversion::kCopy, {}));
  // 2: elements [0, 6) converted to bf16.
  ExtentList first;
  AppendExtents(first, 0, {view::Gather::Source(0, 6)});
  plans.push_back(Storage("2", format::DType::kBFloat16, Conversion::kFp32ToBf16, first));
  // 3: one element.
  ExtentList last;
  AppendExtents(last, 0, {view::Gather::Source(39, 1)});
  plans.push_back(Storage("3", format::DType::kFloat32, Conversion::kCopy, last));

  auto storages = PlannedStorages::Create("tag/s.pt", plans, sources);
  REQUIRE(storages.ok());
  auto files = SourceFiles::Open(sources);
  REQUIRE(files.ok());
  REQUIRE(storages->size() == 4);
  CHECK(storages->storage(0).numel == 15);
  CHECK(storages->extents_end(0) - storages->extents_begin(0) == 3);
  CHECK(storages->extents_end(1) == storages->extents_begin(1));
  CHECK(storages->storage_bytes() == 15 * 4 + 0 + 6 * 2 + 4);
  CHECK(storages->source_bytes() == (9 + 4 + 6 + 1) * 4);
  CHECK(storages->sources_read() == std::vector<uint32_t>{0});

  std::vector<float> want0;
  for (int row = 1; row < 4; ++row) {
    for (int col = 2; col < 5; ++col) want0.push_back(SourceFile::Value(row * 5 + col));
  }
  want0.insert(want0.end(), {0.0f, 0.0f});
  for (int i = 30; i < 34; ++i) want0.push_back(SourceFile::Value(i));
  std::string want2;
  for (int i = 0; i < 6; ++i) {
    const uint16_t v = view::Float32ToBFloat16(SourceFile::Value(i));
    want2.append(reinterpret_cast<const char*>(&v), 2);
  }
  const std::vector<std::string> want = {Fp32Bytes(want0), "", want2, Fp32Bytes({SourceFile::Value(39)})};

  // Every (offset, length) inside each storage, including ranges that start or end inside an
  // element, equals the same bytes of the expected storage.
  for (uint32_t index = 0; index < want.size(); ++index) {
    const std::string& bytes = want[index];
    for (size_t offset = 0; offset <= bytes.size(); ++offset) {
      for (size_t length = 0; offset + length <= bytes.size(); ++length) {
        std::string got(length, '\x7f');
        REQUIRE(storages->Read(*files, index, offset, reinterpret_cast<uint8_t*>(got.data()), length).ok());
        REQUIRE(got == bytes.substr(offset, length));
      }
    }
  }
  uint8_t byte = 0;
  CHECK(storages->Read(*files, 3, 4, &byte, 1).code() == StatusCode::kOutOfRange);
  CHECK(storages->Read(*files, 4, 0, &byte, 1).code() == StatusCode::kInternal);
}

TEST_CASE("planned storages refuse extents that do not match their sources", "[plan][planned_storages]") {
  SourceFile src;
  const std::vector<Source> sources = {Source{src.path(), 8, format::DType::kFloat32, 40, nullptr}};
  ExtentList two;
  AppendExtents(two, 0, {view::Gather::Source(0, 2)});

  SECTION("a missing source") {
    ExtentList missing;
    AppendExtents(missing, 1, {view::Gather::Source(0, 2)});
    auto s = PlannedStorages::Create("f", {Storage("0", format::DType::kFloat32, Conversion::kCopy, missing)}, sources);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInternal);
    CHECK_THAT(s.status().message(), Catch::Contains("missing source"));
  }
  SECTION("a copy whose source has another dtype") {
    auto s = PlannedStorages::Create("f", {Storage("0", format::DType::kBFloat16, Conversion::kCopy, two)}, sources);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInternal);
    CHECK_THAT(s.status().message(), Catch::Contains("wrong dtype"));
  }
  SECTION("extents that do not cover the storage") {
    StoragePlan plan = Storage("0", format::DType::kFloat32, Conversion::kCopy, two);
    plan.numel = 3;
    auto s = PlannedStorages::Create("f", {plan}, sources);
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInternal);
    CHECK_THAT(s.status().message(), Catch::Contains("do not cover"));
  }
}

}  // namespace
}  // namespace reshard::plan
