#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fs/inline_content.h"
#include "fs/null_content.h"
#include "fs/passthrough_content.h"

namespace reshard::fs {
namespace {

// Reads [offset, offset + length) through Read(); fails the test on an error.
std::string ReadRange(const FileContent& content, uint64_t offset, size_t length) {
  std::string out(length, '\xee');
  Result<size_t> count = content.Read(offset, reinterpret_cast<uint8_t*>(out.data()), length);
  REQUIRE(count.ok());
  out.resize(*count);
  return out;
}

// Every FileContent: reads inside, across the end and past it give slices of `expected`.
void CheckReads(const FileContent& content, const std::string& expected) {
  REQUIRE(content.size() == expected.size());
  const uint64_t size = expected.size();
  CHECK(ReadRange(content, 0, size) == expected);
  CHECK(ReadRange(content, 0, size + 100) == expected);
  CHECK(ReadRange(content, size, 10).empty());
  CHECK(ReadRange(content, size + 1000, 10).empty());
  CHECK(ReadRange(content, UINT64_MAX, 10).empty());
  CHECK(ReadRange(content, 0, 0).empty());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200 && size > 0; ++i) {
    const uint64_t offset = rng() % size;
    const size_t length = rng() % (size - offset + 20);
    CHECK(ReadRange(content, offset, length) == expected.substr(offset, length));
  }
}

// A file under $TMPDIR removed again at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& bytes) {
    char name[] = "/tmp/reshardfs_content_test_XXXXXX";
    const int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
    close(fd);
    path_ = name;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string PatternBytes(size_t size) {
  std::string bytes(size, '\0');
  for (size_t k = 0; k < size; ++k) bytes[k] = static_cast<char>(k * 131 + (k >> 8));
  return bytes;
}

TEST_CASE("InlineContent: serves its bytes", "[fs]") {
  CheckReads(InlineContent("global_step100"), "global_step100");
  CheckReads(InlineContent(""), "");
  CheckReads(InlineContent(PatternBytes(70000)), PatternBytes(70000));
}

TEST_CASE("NullContent: serves k % 251 at every offset, across its 1 MiB copy runs", "[fs]") {
  const size_t size = (size_t{3} << 20) + 12345;
  std::string expected(size, '\0');
  for (size_t k = 0; k < size; ++k) expected[k] = static_cast<char>(k % 251);
  const NullContent content(size);
  CheckReads(content, expected);
  CHECK(ReadRange(content, (1 << 20) - 3, (2 << 20) + 7) == expected.substr((1 << 20) - 3, (2 << 20) + 7));
  CHECK(NullContent(0).size() == 0);
  CHECK(NullContent::PatternByte(251 * 1000 + 17) == 17);
}

TEST_CASE("PassthroughContent: serves a real file, concurrently", "[fs]") {
  const std::string bytes = PatternBytes(300000);
  TempFile file(bytes);
  Result<std::shared_ptr<const PassthroughContent>> content = PassthroughContent::Create(file.path());
  REQUIRE(content.ok());
  CHECK((*content)->path() == file.path());
  CheckReads(**content, bytes);

  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::string out(70000, '\0');
      for (int i = 0; i < 300; ++i) {
        const uint64_t offset = rng() % bytes.size();
        const size_t length = rng() % out.size();
        Result<size_t> count = (*content)->Read(offset, reinterpret_cast<uint8_t*>(out.data()), length);
        if (!count.ok() || out.compare(0, *count, bytes, offset, length) != 0) ++mismatches[t];
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(mismatches == std::vector<int>(8, 0));
}

TEST_CASE("PassthroughContent: a removed file keeps being served through its descriptor", "[fs]") {
  const std::string bytes = PatternBytes(5000);
  auto file = std::make_unique<TempFile>(bytes);
  Result<std::shared_ptr<const PassthroughContent>> content = PassthroughContent::Create(file->path());
  REQUIRE(content.ok());
  file.reset();
  CheckReads(**content, bytes);
}

TEST_CASE("PassthroughContent: a file that shrank fails reads past its new end", "[fs]") {
  const std::string bytes = PatternBytes(10000);
  TempFile file(bytes);
  Result<std::shared_ptr<const PassthroughContent>> content = PassthroughContent::Create(file.path());
  REQUIRE(content.ok());
  REQUIRE(truncate(file.path().c_str(), 4000) == 0);

  CHECK((*content)->size() == 10000);  // the size seen at Create()
  CHECK(ReadRange(**content, 100, 3900) == bytes.substr(100, 3900));
  std::vector<uint8_t> out(8000);
  const Result<size_t> across = (*content)->Read(3000, out.data(), out.size());
  REQUIRE_FALSE(across.ok());
  CHECK(across.status().code() == StatusCode::kIoError);
  CHECK(across.status().message() ==
        file.path() + ": file shrank while served: no bytes at offset 4000 of the 10000 it had when opened");
  CHECK_FALSE((*content)->Read(9000, out.data(), 10).ok());
  CHECK(ReadRange(**content, 10000, 10).empty());  // past the recorded size: plain EOF
}

TEST_CASE("PassthroughContent: Create refuses what it cannot serve", "[fs]") {
  const auto missing = PassthroughContent::Create("/nonexistent/reshardfs/file");
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message() == "/nonexistent/reshardfs/file: no such file");
  const auto directory = PassthroughContent::Create("/tmp");
  CHECK(directory.status().code() == StatusCode::kInvalidArgument);
  CHECK(directory.status().message() == "/tmp: not a regular file");
}

}  // namespace
}  // namespace reshard::fs
