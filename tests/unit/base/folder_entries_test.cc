#include "reshard/base/folder_entries.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "reshard/base/unique_fd.h"
#include "tests/unit/temp_dir.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::map<std::string, bool> List(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  REQUIRE(fd.valid());
  auto entries = ListFolder(fd.get(), path);
  REQUIRE(entries.ok());
  std::map<std::string, bool> out;
  for (const FolderEntry& e : *entries) REQUIRE(out.emplace(e.name, e.regular).second);  // each name once
  return out;
}

TEST_CASE("ListFolder: every entry but . and .., regular as stat(2) sees it", "[base][folder_entries]") {
  TempDir tmp;
  const fs::path dir = tmp.path();
  std::ofstream(dir / "fp32.pt") << "x";
  std::ofstream(dir / "exp_avg.pt") << "";
  fs::create_directory(dir / "sub.pt");
  fs::create_symlink(dir / "fp32.pt", dir / "link.pt");
  fs::create_symlink(dir / "missing", dir / "dangling.pt");
  fs::create_symlink(dir / "sub.pt", dir / "dirlink.pt");
  const std::map<std::string, bool> want = {{"fp32.pt", true},      {"exp_avg.pt", true},   {"sub.pt", false},
                                            {"link.pt", true},      {"dangling.pt", false}, {"dirlink.pt", false}};
  CHECK(List(dir.string()) == want);
  CHECK(List((dir / "sub.pt").string()).empty());
}

TEST_CASE("ListFolder: a folder larger than one read of entries is listed whole", "[base][folder_entries]") {
  TempDir tmp;
  std::map<std::string, bool> want;
  for (int k = 0; k < 400; ++k) {
    const std::string name = "state_" + std::to_string(k) + std::string(60, 'n') + ".pt";
    std::ofstream(fs::path(tmp.path()) / name) << k;
    want.emplace(name, true);
  }
  CHECK(List(tmp.path().string()) == want);  // 400 x ~90 bytes of records: several 8 KiB reads
}

TEST_CASE("ListFolder: a descriptor of a file is an I/O error naming the path", "[base][folder_entries]") {
  TempDir tmp;
  const std::string file = (fs::path(tmp.path()) / "f").string();
  std::ofstream(file) << "x";
  const UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.valid());
  auto entries = ListFolder(fd.get(), file);
  REQUIRE_FALSE(entries.ok());
  CHECK(entries.status().code() == StatusCode::kIoError);
  CHECK_THAT(entries.status().message(), Catch::StartsWith(file + ": cannot list"));
}

}  // namespace
}  // namespace reshard
