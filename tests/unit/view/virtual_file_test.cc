#include "reshard/view/virtual_file.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace reshard::view {
namespace {

using Kind = Segment::Kind;

uint8_t PatternByte(uint32_t record, uint64_t offset) {
  return static_cast<uint8_t>(record * 131 + offset * 7 + (offset >> 9));
}

// Record lengths the test table declares; the fill refuses anything outside them, so a
// VirtualFile that asked for out-of-record bytes would fail the test.
struct PatternFill {
  std::vector<uint64_t> record_lengths;
  Status operator()(uint32_t record, uint64_t offset, uint8_t* out, size_t length) const {
    if (record >= record_lengths.size() || offset > record_lengths[record] ||
        length > record_lengths[record] - offset) {
      return Internal("fill outside record " + std::to_string(record));
    }
    for (size_t k = 0; k < length; ++k) out[k] = PatternByte(record, offset + k);
    return Status::Ok();
  }
};

// inline | data | zero | inline | data | inline, with record ids and blob offsets that differ
// from the segment positions, so a mix-up of the two shows.
struct Fixture {
  std::vector<std::string> blobs = {"0123456789abcdef", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"};
  std::vector<Segment> segments = {
      {0, 10, Kind::kInline, 0, 0},     {10, 1000, Kind::kData, 3, 100},
      {1010, 50, Kind::kZero, 0, 0},    {1060, 20, Kind::kInline, 1, 5},
      {1080, 3, Kind::kData, 1, 0},     {1083, 6, Kind::kInline, 0, 10},
  };
  PatternFill fill{{0, 3, 0, 1100}};

  // The expected bytes, built independently of VirtualFile.
  std::string Expected() const {
    std::string out = blobs[0].substr(0, 10);
    for (uint64_t k = 0; k < 1000; ++k) out.push_back(static_cast<char>(PatternByte(3, 100 + k)));
    out.append(50, '\0');
    out += blobs[1].substr(5, 20);
    for (uint64_t k = 0; k < 3; ++k) out.push_back(static_cast<char>(PatternByte(1, k)));
    out += blobs[0].substr(10, 6);
    return out;
  }
};

TEST_CASE("VirtualFile: whole-file read equals the segments laid end to end", "[view]") {
  Fixture f;
  auto file = VirtualFile::Create(f.segments, f.blobs);
  REQUIRE(file.ok());
  CHECK(file->size() == 1089);
  CHECK(file->segments().size() == 6);
  auto all = ReadAll(*file, f.fill);
  REQUIRE(all.ok());
  CHECK(*all == f.Expected());
}

TEST_CASE("VirtualFile: random reads equal slices of the materialized file", "[view]") {
  Fixture f;
  auto file = VirtualFile::Create(f.segments, f.blobs);
  REQUIRE(file.ok());
  const std::string expected = f.Expected();
  const uint64_t size = file->size();
  std::mt19937_64 rng(12345);
  std::vector<uint8_t> buf(size + 64);
  for (int iter = 0; iter < 3000; ++iter) {
    const uint64_t offset = rng() % (size + 20);
    const size_t length = rng() % (iter % 3 == 0 ? 16 : size + 40);
    auto n = file->Read(offset, buf.data(), length, f.fill);
    REQUIRE(n.ok());
    const size_t want = offset >= size ? 0 : std::min<uint64_t>(length, size - offset);
    REQUIRE(*n == want);
    if (want > 0) {
      REQUIRE(std::string(reinterpret_cast<const char*>(buf.data()), want) ==
              expected.substr(offset, want));
    }
  }
  // Every segment boundary, one byte either side.
  for (const Segment& s : file->segments()) {
    for (uint64_t start : {s.offset == 0 ? 0 : s.offset - 1, s.offset}) {
      auto n = file->Read(start, buf.data(), 2, f.fill);
      REQUIRE(n.ok());
      CHECK(std::string(reinterpret_cast<const char*>(buf.data()), *n) ==
            expected.substr(start, *n));
    }
  }
}

TEST_CASE("VirtualFile: reads at or past EOF and empty reads return 0", "[view]") {
  Fixture f;
  auto file = VirtualFile::Create(f.segments, f.blobs);
  REQUIRE(file.ok());
  uint8_t byte = 0;
  CHECK(*file->Read(file->size(), &byte, 1, f.fill) == 0);
  CHECK(*file->Read(file->size() + 1000, &byte, 1, f.fill) == 0);
  CHECK(*file->Read(UINT64_MAX, &byte, 1, f.fill) == 0);
  CHECK(*file->Read(5, nullptr, 0, f.fill) == 0);
  CHECK(*file->Read(file->size() - 1, &byte, 1, f.fill) == 1);
  CHECK(byte == static_cast<uint8_t>('f'));

  auto empty = VirtualFile::Create({}, {});
  REQUIRE(empty.ok());
  CHECK(empty->size() == 0);
  CHECK(*empty->Read(0, &byte, 1, f.fill) == 0);
  CHECK(VirtualFile().size() == 0);
}

TEST_CASE("VirtualFile: a fill error aborts the read and is returned unchanged", "[view]") {
  Fixture f;
  auto file = VirtualFile::Create(f.segments, f.blobs);
  REQUIRE(file.ok());
  auto failing = [](uint32_t record, uint64_t, uint8_t*, size_t) -> Status {
    return IoError("source of record " + std::to_string(record) + " vanished");
  };
  std::vector<uint8_t> buf(64);
  auto bad = file->Read(5, buf.data(), 20, failing);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kIoError);
  CHECK(bad.status().message() == "source of record 3 vanished");
  // Reads that touch no data segment never call the fill.
  auto ok = file->Read(1015, buf.data(), 30, failing);
  REQUIRE(ok.ok());
  CHECK(*ok == 30);
}

TEST_CASE("VirtualFile: Create rejects malformed tables", "[view]") {
  const std::vector<std::string> blobs = {"abcdef"};
  auto rejects = [&](std::vector<Segment> segments, const std::string& needle) {
    auto r = VirtualFile::Create(std::move(segments), blobs);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(needle));
  };
  rejects({{1, 2, Kind::kZero, 0, 0}}, "does not start at 0");
  rejects({{0, 2, Kind::kZero, 0, 0}, {3, 2, Kind::kZero, 0, 0}}, "gap, overlap or unsorted");
  rejects({{0, 2, Kind::kZero, 0, 0}, {1, 2, Kind::kZero, 0, 0}}, "gap, overlap or unsorted");
  rejects({{2, 2, Kind::kZero, 0, 0}, {0, 2, Kind::kZero, 0, 0}}, "does not start at 0");
  rejects({{0, 2, Kind::kZero, 0, 0}, {2, 0, Kind::kZero, 0, 0}}, "has length 0");
  rejects({{0, 4, Kind::kInline, 1, 0}}, "names blob 1 of 1");
  rejects({{0, 4, Kind::kInline, 0, 3}}, "past its 6 bytes");
  rejects({{0, 1, Kind::kInline, 0, UINT64_MAX}}, "past its 6 bytes");
  rejects({{0, 8, Kind::kData, 0, UINT64_MAX - 4}}, "past UINT64_MAX");
  rejects({{0, UINT64_MAX, Kind::kZero, 0, 0}, {UINT64_MAX, 1, Kind::kZero, 0, 0}},
          "ends past UINT64_MAX");
  rejects({{0, 2, static_cast<Kind>(7), 0, 0}}, "unknown kind 7");
}

TEST_CASE("VirtualFile: WriteAll writes the file in 1 MiB chunks", "[view]") {
  // 3 MiB of zeros between data segments: the write crosses chunk and segment boundaries.
  std::vector<Segment> segments = {{0, 6, Kind::kInline, 0, 0},
                                   {6, 1000, Kind::kData, 0, 0},
                                   {1006, 3 << 20, Kind::kZero, 0, 0},
                                   {1006 + (3 << 20), 5000, Kind::kData, 1, 17}};
  auto file = VirtualFile::Create(segments, {"header"});
  REQUIRE(file.ok());
  PatternFill fill{{1000, 5017}};
  std::FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int fd = fileno(tmp);
  REQUIRE(WriteAll(*file, fill, fd).ok());
  std::string written(file->size(), '\0');
  REQUIRE(pread(fd, written.data(), written.size(), 0) == static_cast<ssize_t>(written.size()));
  std::fclose(tmp);
  auto expected = ReadAll(*file, fill);
  REQUIRE(expected.ok());
  CHECK(written == *expected);

  Status bad_fd = WriteAll(*file, fill, -1);
  CHECK(bad_fd.code() == StatusCode::kIoError);
}

TEST_CASE("VirtualFile: concurrent readers see the same bytes", "[view]") {
  Fixture f;
  auto file = VirtualFile::Create(f.segments, f.blobs);
  REQUIRE(file.ok());
  const std::string expected = f.Expected();
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<uint8_t> buf(expected.size());
      for (int i = 0; i < 2000; ++i) {
        const uint64_t offset = rng() % expected.size();
        const size_t length = rng() % 200;
        auto n = file->Read(offset, buf.data(), length, f.fill);
        if (!n.ok() || std::string(reinterpret_cast<const char*>(buf.data()), *n) !=
                           expected.substr(offset, *n)) {
          ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

}  // namespace
}  // namespace reshard::view
