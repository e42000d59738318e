#include "reshard/plan/planned_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "reshard/format/torch_archive.h"
#include "reshard/plan/file_builder.h"
#include "reshard/plan/python_values.h"
#include "reshard/view/dtype_convert.h"

namespace reshard::plan {
namespace {

// A source file of 4 x 6 float32 values 0.5, 1.5, ..., preceded by 16 junk bytes.
class SourceFile {
 public:
  SourceFile() {
    char name[] = "/tmp/reshard_planned_file_XXXXXX";
    const int fd = ::mkstemp(name);
    REQUIRE(fd >= 0);
    path_ = name;
    std::string bytes(16, 'J');
    for (int i = 0; i < 24; ++i) {
      const float v = static_cast<float>(i) + 0.5f;
      bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  ~SourceFile() { ::unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST_CASE("a planned file reads the same bytes in any pieces, and the tensors hold the planned elements",
          "[plan][planned_file]") {
  SourceFile src;
  SourceTable sources;
  const uint32_t s = sources.Intern(Source{src.path(), 16, format::DType::kFloat32, 24, nullptr});
  FileBuilder b("tag/x.pt", sources);
  // Column slice [2, 5) of the 4x6 matrix (a row-parallel TP slice), then 3 zeros of padding.
  ExtentList strided;
  AppendExtents(strided, s, {view::Gather::Source(2, 3, 4, 6)});
  AppendZeros(strided, 3);
  auto fp32 = b.AddTensor(format::DType::kFloat32, {15}, strided, Conversion::kCopy, true);
  REQUIRE(fp32.ok());
  ExtentList first_row;
  AppendExtents(first_row, s, {view::Gather::Source(0, 6)});
  auto bf16 = b.AddTensor(format::DType::kBFloat16, {2, 3}, first_row, Conversion::kFp32ToBf16);
  REQUIRE(bf16.ok());
  format::PickleTree& t = b.tree();
  t.set_root(AddStrDict(t, {{"fp32", *fp32}, {"lp", *bf16}}));
  auto plan = std::move(b).Finish();
  REQUIRE(plan.ok());
  auto file = PlannedFile::Create(*plan, sources.sources());
  REQUIRE(file.ok());
  auto files = SourceFiles::Open(sources.sources());
  REQUIRE(files.ok());

  std::string whole(file->size(), '\0');
  auto n = file->Read(*files, 0, reinterpret_cast<uint8_t*>(whole.data()), whole.size());
  REQUIRE(n.ok());
  REQUIRE(*n == whole.size());

  // Every (offset, length) piece equals the same bytes of the whole read, including pieces that
  // start or end inside an element.
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t offset = rng() % (whole.size() + 8);
    const size_t length = rng() % 300;
    std::string piece(length, '\0');
    auto got = file->Read(*files, offset, reinterpret_cast<uint8_t*>(piece.data()), length);
    REQUIRE(got.ok());
    const size_t expect = offset >= whole.size() ? 0 : std::min<size_t>(length, whole.size() - offset);
    REQUIRE(*got == expect);
    CHECK(piece.substr(0, expect) == whole.substr(std::min<uint64_t>(offset, whole.size()), expect));
  }

  // The written file parses as torch.save, and its storages hold the planned elements.
  char name[] = "/tmp/reshard_planned_out_XXXXXX";
  const int fd = ::mkstemp(name);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, whole.data(), whole.size()) == static_cast<ssize_t>(whole.size()));
  ::close(fd);
  auto archive = format::TorchArchive::Open(name);
  ::unlink(name);
  REQUIRE(archive.ok());
  REQUIRE(archive->tensors().size() == 2);
  const format::TensorRef& a = archive->tensors()[0];
  CHECK(a.requires_grad);
  std::vector<float> got_fp32(15);
  std::memcpy(got_fp32.data(), archive->StorageData(archive->storages().at(a.storage.key)), 60);
  const std::vector<float> want_fp32 = {2.5f, 3.5f, 4.5f, 8.5f, 9.5f, 10.5f, 14.5f, 15.5f,
                                        16.5f, 20.5f, 21.5f, 22.5f, 0.0f, 0.0f, 0.0f};
  CHECK(got_fp32 == want_fp32);
  const format::TensorRef& l = archive->tensors()[1];
  CHECK(l.dtype == format::DType::kBFloat16);
  CHECK(l.shape == std::vector<int64_t>{2, 3});
  std::vector<uint16_t> got_bf16(6);
  std::memcpy(got_bf16.data(), archive->StorageData(archive->storages().at(l.storage.key)), 12);
  for (int i = 0; i < 6; ++i) CHECK(got_bf16[i] == view::Float32ToBFloat16(static_cast<float>(i) + 0.5f));
  CHECK(file->storage_bytes() == 60 + 12);
  CHECK(file->source_bytes() == 12 * 4 + 6 * 4);
}

TEST_CASE("a source file truncated after planning fails the read with the path", "[plan][planned_file]") {
  SourceFile src;
  SourceTable sources;
  const uint32_t s = sources.Intern(Source{src.path(), 16, format::DType::kFloat32, 24, nullptr});
  FileBuilder b("tag/y.pt", sources);
  ExtentList all;
  AppendExtents(all, s, {view::Gather::Source(0, 24)});
  auto tensor = b.AddTensor(format::DType::kFloat32, {24}, all, Conversion::kCopy);
  REQUIRE(tensor.ok());
  b.tree().set_root(*tensor);
  auto plan = std::move(b).Finish();
  REQUIRE(plan.ok());
  auto file = PlannedFile::Create(*plan, sources.sources());
  REQUIRE(file.ok());
  auto files = SourceFiles::Open(sources.sources());
  REQUIRE(files.ok());
  REQUIRE(::truncate(src.path().c_str(), 40) == 0);
  std::string whole(file->size(), '\0');
  auto n = file->Read(*files, 0, reinterpret_cast<uint8_t*>(whole.data()), whole.size());
  REQUIRE_FALSE(n.ok());
  CHECK(n.status().code() == StatusCode::kIoError);
  CHECK_THAT(n.status().message(), Catch::Contains(src.path()) && Catch::Contains("truncated"));
}

TEST_CASE("SourceFiles refuses a file too short for its tensor at open", "[plan][planned_file]") {
  SourceFile src;
  auto files = SourceFiles::Open({Source{src.path(), 16, format::DType::kFloat32, 25, nullptr}});
  REQUIRE_FALSE(files.ok());
  CHECK(files.status().code() == StatusCode::kCorrupt);
  CHECK_THAT(files.status().message(), Catch::Contains("holds 112 bytes"));
}

TEST_CASE("SourceFiles reads a computed source from its bytes in memory, never from its path", "[plan][planned_file]") {
  const std::vector<float> values = {1.5f, -0.0f, 3.25f, 1e-40f, -7.0f};
  auto bytes = std::make_shared<std::string>(8, 'x');
  bytes->append(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  auto files = SourceFiles::Open({Source{"/nonexistent/the mean of 2 TP slices", 8, format::DType::kFloat32, 5, bytes}});
  REQUIRE(files.ok());
  CHECK(files->num_files() == 0);
  std::vector<float> got(3, 9.0f);
  REQUIRE(files->ReadElements(0, 1, 3, reinterpret_cast<uint8_t*>(got.data())).ok());
  CHECK(std::memcmp(got.data(), values.data() + 1, 12) == 0);
  CHECK(files->CheckUnchanged({0}).ok());
  auto past = files->ReadElements(0, 3, 3, reinterpret_cast<uint8_t*>(got.data()));
  CHECK(past.code() == StatusCode::kOutOfRange);

  auto short_bytes = SourceFiles::Open({Source{"mean", 8, format::DType::kFloat32, 6, bytes}});
  REQUIRE_FALSE(short_bytes.ok());
  CHECK(short_bytes.status().code() == StatusCode::kCorrupt);
}

TEST_CASE("FileBuilder numbers storages in pickling order", "[plan][file_builder]") {
  SourceTable sources;
  FileBuilder b("tag/z.pt", sources);
  auto first = b.AddTensor(format::DType::kFloat32, {0}, {}, Conversion::kCopy);
  auto second = b.AddTensor(format::DType::kFloat32, {0}, {}, Conversion::kCopy);
  REQUIRE((first.ok() && second.ok()));
  format::PickleTree& t = b.tree();
  t.set_root(t.AddList({*second, *first}));  // pickled in the reverse order of creation
  auto plan = std::move(b).Finish();
  REQUIRE(plan.ok());
  auto storages = format::CollectStorages(plan->tree);
  REQUIRE(storages.ok());
  REQUIRE(storages->size() == 2);
  CHECK((*storages)[0].key == "0");
  CHECK((*storages)[1].key == "1");
  CHECK(plan->storages[0].key == "0");
}

TEST_CASE("AddTensor refuses extents of the wrong length", "[plan][file_builder]") {
  SourceTable sources;
  FileBuilder b("tag/w.pt", sources);
  ExtentList three;
  AppendZeros(three, 3);
  auto t = b.AddTensor(format::DType::kFloat32, {4}, three, Conversion::kCopy);
  REQUIRE_FALSE(t.ok());
  CHECK(t.status().code() == StatusCode::kInternal);
}

}  // namespace
}  // namespace reshard::plan
