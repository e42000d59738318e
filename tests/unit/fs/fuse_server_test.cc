// Serve() and Unmount() in-process, against the real kernel: needs /dev/fuse and fusermount3,
// and passes with a warning (checking nothing) where /dev/fuse is not usable.
#include "fs/fuse_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "fs/inline_content.h"
#include "fs/passthrough_content.h"

namespace reshard::fs {
namespace {

bool FuseUsable() { return access("/dev/fuse", R_OK | W_OK) == 0; }

// A fresh directory under /tmp, removed (with what is left in it) at scope exit.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/reshardfs_server_test_XXXXXX";
    REQUIRE(mkdtemp(name) != nullptr);
    path_ = name;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sends spdlog's default logger into a string for its lifetime.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_);
    sink->set_pattern("%l %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return stream_.str(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream stream_;
};

// Serve() on its own thread. The destructor unmounts (lazily if it must) and joins, so a
// failed check never leaves a mount or a running thread behind.
class ServerThread {
 public:
  ServerThread(const Namespace& ns, ServeOptions options) : mountpoint_(options.mountpoint) {
    struct stat before {};
    REQUIRE(stat(mountpoint_.c_str(), &before) == 0);
    thread_ = std::thread([this, &ns, options] { status_ = Serve(ns, options); });
    // The mount replaces the directory's device; stat() then waits for the server's answer.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    struct stat now = before;
    while (now.st_dev == before.st_dev && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      REQUIRE(stat(mountpoint_.c_str(), &now) == 0);
    }
    REQUIRE(now.st_dev != before.st_dev);
  }
  ~ServerThread() {
    if (!thread_.joinable()) return;
    if (!Unmount(mountpoint_).ok()) {
      std::system(("fusermount3 -u -z " + mountpoint_ + " 2>/dev/null").c_str());
    }
    thread_.join();
  }

  // Unmounts and returns what Serve() returned.
  Status Stop() {
    const Status unmounted = Unmount(mountpoint_);
    REQUIRE(unmounted.ok());
    thread_.join();
    return status_;
  }

 private:
  std::string mountpoint_;
  std::thread thread_;
  Status status_;
};

std::string ReadAt(const std::string& path, off_t offset, size_t length, int* error) {
  std::string out(length, '\0');
  const int fd = open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  const ssize_t n = pread(fd, out.data(), length, offset);
  *error = n < 0 ? errno : 0;
  close(fd);
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

TEST_CASE("Serve: a failing file answers EIO with one warning; the others keep serving", "[fs][fuse]") {
  if (!FuseUsable()) {
    WARN("/dev/fuse is not usable here: nothing checked");
    return;
  }
  TempDir dir;
  const std::string source = dir.path() + "/source.bin";
  const std::string mountpoint = dir.path() + "/mnt";
  REQUIRE(mkdir(mountpoint.c_str(), 0755) == 0);
  std::string bytes(100000, '\0');
  for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = static_cast<char>(k * 7);
  {
    FILE* f = std::fopen(source.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
    std::fclose(f);
  }
  Result<std::shared_ptr<const PassthroughContent>> passthrough = PassthroughContent::Create(source);
  REQUIRE(passthrough.ok());
  Result<Namespace> ns = Namespace::Build({
      {"step/shrinking.bin", *passthrough},
      {"step/latest", std::make_shared<const InlineContent>("global_step3")},
  });
  REQUIRE(ns.ok());
  REQUIRE(truncate(source.c_str(), 1000) == 0);

  CapturedLog log;
  ServeOptions options;
  options.mountpoint = mountpoint;
  options.foreground = true;
  options.direct_io = true;  // each pread becomes exactly one FUSE read, no readahead
  ServerThread server(*ns, options);

  int error = 0;
  CHECK(ReadAt(mountpoint + "/step/shrinking.bin", 0, 1000, &error) == bytes.substr(0, 1000));
  CHECK(error == 0);
  CHECK(ReadAt(mountpoint + "/step/shrinking.bin", 2000, 100, &error).empty());
  CHECK(error == EIO);
  CHECK(ReadAt(mountpoint + "/step/latest", 0, 100, &error) == "global_step3");
  CHECK(error == 0);
  struct stat st {};
  REQUIRE(stat((mountpoint + "/step/shrinking.bin").c_str(), &st) == 0);
  CHECK(st.st_size == 100000);
  CHECK(open((mountpoint + "/step/latest").c_str(), O_WRONLY) == -1);
  CHECK(errno == EROFS);

  CHECK(server.Stop().ok());
  CHECK(log.text() == "warning step/shrinking.bin: read of 100 bytes at offset 2000 failed: " + source +
                          ": file shrank while served: no bytes at offset 2000 of the 100000 it had when opened\n");
  const Status again = Unmount(mountpoint);
  CHECK(again.code() == StatusCode::kNotFound);
  CHECK(again.message() == mountpoint + ": not mounted");
}

TEST_CASE("Serve: errors before mounting are returned, with libfuse's reason", "[fs][fuse]") {
  Result<Namespace> ns = Namespace::Build({});
  REQUIRE(ns.ok());
  ServeOptions options;
  options.foreground = true;
  options.mountpoint = "/nonexistent/reshardfs_mnt";
  Status status = Serve(*ns, options);
  CHECK(status.message() == "mountpoint /nonexistent/reshardfs_mnt: No such file or directory");

  TempDir dir;
  options.mountpoint = dir.path();
  options.fuse_options = {"bogus_option"};
  status = Serve(*ns, options);
  CHECK(status.code() == StatusCode::kInvalidArgument);
  CHECK(status.message() == "cannot start a FUSE session: fuse: unknown option(s): `-o bogus_option'");
}

TEST_CASE("Unmount: refuses what is not a reshardfs mount", "[fs][fuse]") {
  const Status proc = Unmount("/proc");
  CHECK(proc.code() == StatusCode::kInvalidArgument);
  CHECK(proc.message() == "/proc: not a reshardfs mount (it is proc)");
  TempDir dir;
  const Status plain = Unmount(dir.path() + "/");
  CHECK(plain.code() == StatusCode::kNotFound);
  CHECK(plain.message() == dir.path() + "/: not mounted");
}

}  // namespace
}  // namespace reshard::fs
