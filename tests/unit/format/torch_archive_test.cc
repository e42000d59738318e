// The torch archive writer and reader against each other: a planned archive, materialised to a
// file, opens with TorchArchive and every tensor's bytes are the ones the fill supplied.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "reshard/format/torch_archive.h"
#include "reshard/format/torch_archive_writer.h"
#include "reshard/view/virtual_file.h"

namespace reshard::format {
namespace {

class TempFile {
 public:
  TempFile() {
    char name[] = "/tmp/reshard_archive_testXXXXXX";
    fd_ = ::mkstemp(name);
    path_ = name;
  }
  ~TempFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// Byte k of storage s is (s * 31 + k) mod 251: distinct per storage and position.
uint8_t Pattern(uint32_t storage, uint64_t k) { return static_cast<uint8_t>((storage * 31 + k) % 251); }

TEST_CASE("LayoutTorchArchive output opens with TorchArchive, tensors and bytes intact", "[format]") {
  PickleTree tree;
  TensorRef w;
  w.dtype = DType::kBFloat16;
  w.storage = {"0", "cpu", DType::kBFloat16, false, 2 * 4 * 2};
  w.shape = {2, 4};
  w.stride = {4, 1};
  TensorRef row = w;  // a view of the same storage: its second row
  row.shape = {4};
  row.stride = {1};
  row.storage_offset = 4;
  TensorRef e;
  e.dtype = DType::kFloat8E4M3FN;
  e.storage = {"1", "cpu", DType::kUInt8, true, 3};
  e.shape = {3};
  e.stride = {1};
  auto w_id = AddTensor(tree, w);
  auto row_id = AddTensor(tree, row);
  auto e_id = AddTensor(tree, e);
  REQUIRE((w_id.ok() && row_id.ok() && e_id.ok()));
  tree.set_root(tree.AddDict({{tree.AddStr("w"), *w_id}, {tree.AddStr("row"), *row_id},
                              {tree.AddStr("e"), *e_id}, {tree.AddStr("n"), tree.AddInt(1LL << 40)}}));

  auto layout = LayoutTorchArchive(tree, {{"0", 16}, {"1", 3}});
  REQUIRE(layout.ok());
  const uint32_t first = layout->first_storage_entry;
  auto fill = [&](uint32_t record, uint64_t offset, uint8_t* out, size_t length) -> Status {
    for (size_t k = 0; k < length; ++k) out[k] = Pattern(record - first, offset + k);
    return Status::Ok();
  };
  TempFile file;
  REQUIRE(view::WriteAll(layout->zip.file, fill, file.fd()).ok());

  auto archive = TorchArchive::Open(file.path());
  REQUIRE(archive.ok());
  CHECK(archive->prefix() == "archive");
  REQUIRE(archive->tensors().size() == 3);
  CHECK(archive->tensors()[1].storage_offset == 4);
  CHECK(archive->tensors()[2].dtype == DType::kFloat8E4M3FN);
  REQUIRE(archive->storages().size() == 2);
  for (const auto& [key, storage] : archive->storages()) {
    const uint32_t s = key == "0" ? 0 : 1;
    const uint8_t* data = archive->StorageData(storage);
    for (uint64_t k = 0; k < storage.ref.nbytes; ++k) REQUIRE(data[k] == Pattern(s, k));
    CHECK(storage.data_offset % 64 == 0);
  }
  CHECK(archive->tree().node(archive->tree().DictGet(archive->tree().root(), "n")).i == (1LL << 40));
}

TEST_CASE("LayoutTorchArchive refuses storages that do not match the tree", "[format]") {
  PickleTree tree;
  TensorRef t;
  t.dtype = DType::kFloat32;
  t.storage = {"0", "cpu", DType::kFloat32, false, 8};
  t.shape = {2};
  t.stride = {1};
  auto id = AddTensor(tree, t);
  REQUIRE(id.ok());
  tree.set_root(*id);
  CHECK_THAT(LayoutTorchArchive(tree, {}).status().message(), Catch::Contains("unlisted storage '0'"));
  CHECK_THAT(LayoutTorchArchive(tree, {{"0", 4}}).status().message(), Catch::Contains("names 8"));
  CHECK_THAT(LayoutTorchArchive(tree, {{"0", 8}, {"9", 1}}).status().message(), Catch::Contains("not used"));
  CHECK_THAT(LayoutTorchArchive(tree, {{"0", 8}, {"0", 8}}).status().message(), Catch::Contains("repeated"));
}

TEST_CASE("TorchArchive refuses non-zip and incomplete archives with the file name", "[format]") {
  TempFile file;
  const std::string text = "just text, not a checkpoint";
  REQUIRE(::write(file.fd(), text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  auto archive = TorchArchive::Open(file.path());
  REQUIRE_FALSE(archive.ok());
  CHECK(archive.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(archive.status().message(), Catch::StartsWith(file.path()));
  CHECK_THAT(archive.status().message(), Catch::Contains("not a zip archive"));
  auto missing = TorchArchive::Open("/nonexistent/reshard.pt");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace reshard::format
