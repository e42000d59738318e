// TempDir for the unit tests: a fresh directory under /tmp, removed with its contents at scope exit.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

#include <catch2/catch.hpp>

namespace reshard::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "reshard_unit_test") {
    std::string name = "/tmp/" + prefix + "_XXXXXX";
    REQUIRE(::mkdtemp(name.data()) != nullptr);
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace reshard::testing
