#include "reshard/base/fd_cache.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/temp_dir.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

// The first `n` bytes of file `file` read through the cache.
std::string ReadThrough(const FdCache& cache, uint32_t file, size_t n) {
  auto lease = cache.Acquire(file);
  REQUIRE(lease.ok());
  std::string out(n, '\0');
  REQUIRE(::pread(lease->fd(), out.data(), n, 0) == static_cast<ssize_t>(n));
  return out;
}

// Files "f0".."f<n-1>" holding "file <k>".
std::vector<std::string> MakeFiles(const TempDir& tmp, int n) {
  std::vector<std::string> paths;
  for (int k = 0; k < n; ++k) {
    paths.push_back(tmp.path() / ("f" + std::to_string(k)));
    WriteFile(paths.back(), "file " + std::to_string(k));
  }
  return paths;
}

size_t OpenDescriptors() {
  return static_cast<size_t>(std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{}));
}

TEST_CASE("FdCache: files within the budget are opened once and stay open", "[base][fd_cache]") {
  TempDir tmp;
  const auto paths = MakeFiles(tmp, 5);
  const size_t before = OpenDescriptors();
  auto cache = FdCache::Create(paths, 5);
  REQUIRE(cache.ok());
  CHECK(cache->all_open());
  CHECK(OpenDescriptors() == before + 5);
  CHECK(cache->identity(3).size == 6);
  // Renamed over: the descriptor opened at Create still reads the planned bytes.
  WriteFile(tmp.path() / "new", "FILE 3");
  fs::rename(tmp.path() / "new", paths[3]);
  CHECK(ReadThrough(*cache, 3, 6) == "file 3");
}

TEST_CASE("FdCache: past the budget, files open on demand and at most `capacity` stay open", "[base][fd_cache]") {
  TempDir tmp;
  const auto paths = MakeFiles(tmp, 9);
  const size_t before = OpenDescriptors();
  auto cache = FdCache::Create(paths, 3);
  REQUIRE(cache.ok());
  CHECK_FALSE(cache->all_open());
  CHECK(OpenDescriptors() == before);
  for (int round = 0; round < 3; ++round) {
    for (uint32_t k = 0; k < 9; ++k) {
      CHECK(ReadThrough(*cache, (k * 4 + round) % 9, 6) == "file " + std::to_string((k * 4 + round) % 9));
      CHECK(OpenDescriptors() <= before + 3);
    }
  }
}

TEST_CASE("FdCache: a lease keeps its descriptor readable after eviction", "[base][fd_cache]") {
  TempDir tmp;
  const auto paths = MakeFiles(tmp, 3);
  auto cache = FdCache::Create(paths, 1);
  REQUIRE(cache.ok());
  auto first = cache->Acquire(0);
  REQUIRE(first.ok());
  CHECK(ReadThrough(*cache, 1, 6) == "file 1");  // evicts file 0 from the cache
  std::string bytes(6, '\0');
  REQUIRE(::pread(first->fd(), bytes.data(), 6, 0) == 6);
  CHECK(bytes == "file 0");
}

TEST_CASE("FdCache: a file reopened past the budget must be the file that was planned", "[base][fd_cache]") {
  TempDir tmp;
  const auto paths = MakeFiles(tmp, 4);
  auto cache = FdCache::Create(paths, 2);
  REQUIRE(cache.ok());
  CHECK(ReadThrough(*cache, 0, 6) == "file 0");
  CHECK(ReadThrough(*cache, 1, 6) == "file 1");
  CHECK(ReadThrough(*cache, 2, 6) == "file 2");  // file 0 closed

  SECTION("replaced by another file of the same size: refused, never its bytes") {
    WriteFile(tmp.path() / "new", "FILE 0");
    fs::rename(tmp.path() / "new", paths[0]);
    auto lease = cache->Acquire(0);
    REQUIRE_FALSE(lease.ok());
    CHECK(lease.status().code() == StatusCode::kIoError);
    CHECK(lease.status().message() == paths[0] + ": replaced since it was planned (another file is at its path now); "
                                                 "mount again to serve the new checkpoint");
    CHECK_FALSE(cache->CheckUnchanged(0).ok());
  }
  SECTION("rewritten in place with other length: refused") {
    WriteFile(paths[0], "file 0 and more");
    auto lease = cache->Acquire(0);
    REQUIRE_FALSE(lease.ok());
    CHECK(lease.status().message() ==
          paths[0] + ": changed since it was opened (6 bytes, now 15); mount again to serve the new checkpoint");
  }
  SECTION("deleted: refused with the path and errno") {
    fs::remove(paths[0]);
    auto lease = cache->Acquire(0);
    REQUIRE_FALSE(lease.ok());
    CHECK(lease.status().message() == paths[0] + ": No such file or directory");
  }
  SECTION("unchanged: reopened and read") {
    CHECK(cache->CheckUnchanged(0).ok());
    CHECK(ReadThrough(*cache, 0, 6) == "file 0");
  }
}

TEST_CASE("FdCache: Create names a file that cannot be opened or stat'ed", "[base][fd_cache]") {
  TempDir tmp;
  auto paths = MakeFiles(tmp, 2);
  paths.push_back(tmp.path() / "missing");
  for (const size_t capacity : {size_t{8}, size_t{1}}) {
    auto cache = FdCache::Create(paths, capacity);
    REQUIRE_FALSE(cache.ok());
    CHECK(cache.status().message() == paths[2] + ": No such file or directory");
  }
}

TEST_CASE("FdCache: keeps each path as given, and refuses one with a NUL byte", "[base][fd_cache]") {
  TempDir tmp;
  auto paths = MakeFiles(tmp, 3);
  for (const size_t capacity : {size_t{8}, size_t{1}}) {
    auto cache = FdCache::Create(paths, capacity);
    REQUIRE(cache.ok());
    for (uint32_t k = 0; k < 3; ++k) CHECK(cache->path(k) == paths[k]);
  }
  // c_str() of such a path names another file (its part before the NUL): never open that one.
  paths[1] = paths[0] + std::string(1, '\0') + "x";
  auto cache = FdCache::Create(paths, 8);
  REQUIRE_FALSE(cache.ok());
  CHECK(cache.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("FdCache: many long paths, held compressed, reopen and name the right files", "[base][fd_cache]") {
  // Parameter folders of a universal checkpoint: paths that differ in a number and a last component,
  // spanning many of the compressed chunks the paths are held in.
  TempDir tmp;
  std::vector<std::string> paths;
  for (int layer = 0; layer < 150; ++layer) {
    const fs::path folder = tmp.path() / ("model.layers." + std::to_string(layer) + ".self_attn.q_proj.weight");
    fs::create_directory(folder);
    for (const char* state : {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt", "step.pt"}) {
      paths.push_back(folder / state);
      WriteFile(paths.back(), paths.back());
    }
  }
  auto cache = FdCache::Create(paths, 4);
  REQUIRE(cache.ok());
  REQUIRE_FALSE(cache->all_open());
  for (const uint32_t k : {0u, 599u, 17u, 300u, 301u, 4u, 598u}) {
    CHECK(cache->path(k) == paths[k]);
    CHECK(ReadThrough(*cache, k, paths[k].size()) == paths[k]);
    CHECK(cache->CheckUnchanged(k).ok());
  }
}

TEST_CASE("FdCache: concurrent readers of more files than the budget read the right bytes", "[base][fd_cache]") {
  TempDir tmp;
  const auto paths = MakeFiles(tmp, 64);
  auto cache = FdCache::Create(paths, 5);
  REQUIRE(cache.ok());
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t k = 0; k < 2000; ++k) {
        const uint32_t file = (k * 7 + static_cast<uint32_t>(t) * 13) % 64;
        auto lease = cache->Acquire(file);
        std::string bytes(8, '\0');
        const ssize_t n = lease.ok() ? ::pread(lease->fd(), bytes.data(), 8, 0) : -1;
        const std::string want = "file " + std::to_string(file);
        if (n != static_cast<ssize_t>(want.size()) || bytes.substr(0, want.size()) != want) ++wrong[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == std::vector<int>(4, 0));
}

}  // namespace
}  // namespace reshard
