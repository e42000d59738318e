#include "reshard/format/zip_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "reshard/base/mapped_file.h"
#include "reshard/format/zip_format.h"
#include "reshard/format/zip_writer.h"

namespace reshard::format {
namespace {

// Data bytes that never form a zip signature, so a truncated archive cannot contain a stray
// EOCD inside its record data.
Status FillElevens(uint32_t, uint64_t, uint8_t* out, size_t length) {
  for (size_t k = 0; k < length; ++k) out[k] = 0x11;
  return Status::Ok();
}

// A small torch-style archive and the offsets of its structures.
struct Archive {
  std::vector<ZipEntry> entries = {
      {"archive/data.pkl", 9, "\x80\x02}q(X..."},
      {"archive/data/0", 100, std::nullopt},
      {"archive/version", 2, "3\n"},
  };
  std::string bytes;
  ZipLayout layout;

  Archive() {
    auto l = LayoutZip(entries);
    REQUIRE(l.ok());
    layout = std::move(l).value();
    auto b = view::ReadAll(layout.file, FillElevens);
    REQUIRE(b.ok());
    bytes = std::move(b).value();
  }
  uint64_t Central(size_t i) const {
    uint64_t pos = layout.central_directory_offset;
    for (size_t k = 0; k < i; ++k) pos += zip::kCentralHeaderSize + entries[k].name.size();
    return pos;
  }
  uint64_t Zip64Eocd() const {
    return layout.central_directory_offset + layout.central_directory_size;
  }
  uint64_t Locator() const { return Zip64Eocd() + zip::kZip64EocdSize; }
  uint64_t Eocd() const { return Locator() + zip::kZip64LocatorSize; }
  void Put16(uint64_t at, uint16_t v) {
    for (int k = 0; k < 2; ++k) bytes[at + k] = static_cast<char>(v >> (8 * k));
  }
  void Put32(uint64_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) bytes[at + k] = static_cast<char>(v >> (8 * k));
  }
  void Put64(uint64_t at, uint64_t v) {
    for (int k = 0; k < 8; ++k) bytes[at + k] = static_cast<char>(v >> (8 * k));
  }
};

// Parses an exact-size heap copy, so that AddressSanitizer sees any read past the end.
Result<std::vector<ZipRecord>> Parse(const std::string& bytes, size_t length) {
  std::vector<uint8_t> copy(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(length));
  return ReadZipDirectory(copy.data(), copy.size());
}
Result<std::vector<ZipRecord>> Parse(const std::string& bytes) {
  return Parse(bytes, bytes.size());
}

void ExpectError(const Result<std::vector<ZipRecord>>& r, StatusCode code,
                 const std::string& needle) {
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == code);
  CHECK_THAT(r.status().message(), Catch::Contains(needle));
}

TEST_CASE("ReadZipDirectory: reads a torch-style archive", "[format]") {
  Archive a;
  auto records = Parse(a.bytes);
  REQUIRE(records.ok());
  REQUIRE(records->size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK((*records)[i].name == a.entries[i].name);
    CHECK((*records)[i].size == a.entries[i].size);
    CHECK((*records)[i].data_offset == a.layout.data_offsets[i]);
  }
  CHECK(a.bytes.substr((*records)[0].data_offset, 9) == *a.entries[0].content);
}

TEST_CASE("ReadZipDirectory: every truncation is an error, never a crash", "[format]") {
  Archive a;
  for (size_t length = 0; length < a.bytes.size(); ++length) {
    CAPTURE(length);
    auto r = Parse(a.bytes, length);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kCorrupt);
  }
  ExpectError(ReadZipDirectory(nullptr, 0), StatusCode::kCorrupt, "0 bytes is too short");
}

TEST_CASE("ReadZipDirectory: wrong magic is not a zip archive", "[format]") {
  Archive a;
  a.bytes[0] = '\x80';  // a legacy pickle starts with PROTO
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "not a zip archive: file starts with");
}

TEST_CASE("ReadZipDirectory: missing end of central directory", "[format]") {
  Archive a;
  a.Put32(a.Eocd(), 0x06054b51);
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "no end of central directory record");
}

TEST_CASE("ReadZipDirectory: central directory entry with a bad signature", "[format]") {
  Archive a;
  a.Put32(a.Central(1), 0x02014b51);
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
              "central directory entry #1 at offset " + std::to_string(a.Central(1)) +
                  " has signature 0x02014b51 (expected 0x02014b50)");
}

TEST_CASE("ReadZipDirectory: entry count mismatch", "[format]") {
  SECTION("fewer entries declared than present") {
    Archive a;
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdEntriesOnDisk, 2);
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdEntries, 2);
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "bytes left after the 2 entries declared");
  }
  SECTION("more entries declared than the directory can hold") {
    Archive a;
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdEntriesOnDisk, 4);
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdEntries, 4);
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "cannot hold the 4 entries declared");
  }
  SECTION("directory size too small for the entries declared") {
    Archive a;
    const uint64_t last_entry = zip::kCentralHeaderSize + a.entries[2].name.size();
    // The last entry's name runs past the declared end...
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdCdSize, a.layout.central_directory_size - 10);
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
                "central directory entry #2 at offset " + std::to_string(a.Central(2)) +
                    ": name, extra and comment (15+0+0 bytes) run past the directory end");
    // ... or even its fixed 46-byte header does.
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdCdSize,
            a.layout.central_directory_size - last_entry + 20);
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
                "central directory entry #2 at offset " + std::to_string(a.Central(2)) +
                    " runs past the directory end");
  }
  SECTION("entries on this disk differ from the total") {
    Archive a;
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdEntriesOnDisk, 2);
    ExpectError(Parse(a.bytes), StatusCode::kUnsupported, "multi-disk archive");
  }
}

TEST_CASE("ReadZipDirectory: central directory or zip64 EOCD out of range", "[format]") {
  SECTION("directory offset past the end records") {
    Archive a;
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdCdOffset, a.bytes.size());
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "runs past the end records");
  }
  SECTION("directory offset near UINT64_MAX") {
    Archive a;
    a.Put64(a.Zip64Eocd() + zip::kZip64EocdCdOffset, UINT64_MAX - 10);
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "runs past the end records");
  }
  SECTION("zip64 EOCD offset past its locator") {
    Archive a;
    a.Put64(a.Locator() + zip::kZip64LocatorEocdOffset, a.Locator() - 10);
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "does not end before its locator");
  }
  SECTION("zip64 EOCD with a bad signature") {
    Archive a;
    a.Put32(a.Zip64Eocd(), 0x12345678);
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "has signature 0x12345678");
  }
  SECTION("local header offset past the record area") {
    Archive a;
    a.Put32(a.Central(2) + zip::kCentralLocalHeaderOffset,
            static_cast<uint32_t>(a.layout.central_directory_offset - 10));
    ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
                "record 'archive/version': local header offset");
  }
}

TEST_CASE("ReadZipDirectory: compressed records are unsupported", "[format]") {
  Archive a;
  a.Put16(a.Central(1) + zip::kCentralMethod, 8);
  ExpectError(Parse(a.bytes), StatusCode::kUnsupported,
              "record 'archive/data/0' is compressed (method 8)");
}

TEST_CASE("ReadZipDirectory: encrypted records are unsupported", "[format]") {
  Archive a;
  a.Put16(a.Central(0) + zip::kCentralFlags, 0x0809);
  ExpectError(Parse(a.bytes), StatusCode::kUnsupported,
              "record 'archive/data.pkl' is encrypted (flags 0x0809)");
}

TEST_CASE("ReadZipDirectory: multi-disk archives are unsupported", "[format]") {
  Archive a;
  a.Put32(a.Locator() + zip::kZip64LocatorTotalDisks, 2);
  ExpectError(Parse(a.bytes), StatusCode::kUnsupported, "zip64 locator names disk 0 of 2");
}

TEST_CASE("ReadZipDirectory: stored record whose sizes differ", "[format]") {
  Archive a;
  a.Put32(a.Central(1) + zip::kCentralCompressedSize, 99);
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
              "record 'archive/data/0' is stored but its compressed size 99 differs from its "
              "size 100");
}

TEST_CASE("ReadZipDirectory: local header with a bad signature", "[format]") {
  Archive a;
  a.Put32(a.layout.local_header_offsets[1], 0x04034b00);
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
              "record 'archive/data/0': local header at offset " +
                  std::to_string(a.layout.local_header_offsets[1]) +
                  " has signature 0x04034b00 (expected 0x04034b50)");
}

TEST_CASE("ReadZipDirectory: local header naming another record", "[format]") {
  Archive a;
  a.bytes[a.layout.local_header_offsets[1] + 30 + 8] = 'D';
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
              "record 'archive/data/0': local header at offset " +
                  std::to_string(a.layout.local_header_offsets[1]) + " names 'archive/Data/0'");
}

TEST_CASE("ReadZipDirectory: record data out of bounds", "[format]") {
  Archive a;
  a.Put32(a.Central(1) + zip::kCentralCompressedSize, 100000);
  a.Put32(a.Central(1) + zip::kCentralUncompressedSize, 100000);
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt,
              "record 'archive/data/0': data of 100000 bytes at offset " +
                  std::to_string(a.layout.data_offsets[1]) + " runs past the record area");
}

TEST_CASE("ReadZipDirectory: zip64 markers without a zip64 extra field", "[format]") {
  Archive a;
  a.Put32(a.Central(0) + zip::kCentralUncompressedSize, 0xFFFFFFFF);
  ExpectError(Parse(a.bytes), StatusCode::kCorrupt, "no zip64 extra field");
}

TEST_CASE("ReadZipDirectory: classic archive without zip64 records, and a comment", "[format]") {
  Archive a;
  // Drop the zip64 EOCD and locator: what remains is a plain zip, valid on its own.
  std::string classic = a.bytes.substr(0, a.Zip64Eocd()) + a.bytes.substr(a.Eocd());
  auto records = Parse(classic);
  REQUIRE(records.ok());
  CHECK(records->size() == 3);
  CHECK((*records)[2].data_offset == a.layout.data_offsets[2]);
  // A comment after the EOCD: the backward scan still finds it.
  classic[classic.size() - 2] = 5;
  classic += "hello";
  records = Parse(classic);
  REQUIRE(records.ok());
  CHECK(records->size() == 3);
  // A comment length that runs past the end of the file is no EOCD.
  classic[classic.size() - 7] = 6;
  ExpectError(Parse(classic), StatusCode::kCorrupt, "no end of central directory");
}

TEST_CASE("ReadZipDirectory: zip64 archive larger than 4 GiB, as a sparse file", "[format]") {
  constexpr uint64_t kBig = (uint64_t{4} << 30) + 100;
  const std::vector<ZipEntry> entries = {
      {"archive/data.pkl", 3, "pkl"},
      {"archive/data/0", kBig, std::nullopt},
      {"archive/data/1", 8, std::nullopt},
      {"archive/version", 2, "3\n"},
  };
  auto layout = LayoutZip(entries);
  REQUIRE(layout.ok());
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = std::string(tmpdir ? tmpdir : "/tmp") + "/reshard_zip64_XXXXXX";
  const int fd = mkstemp(path.data());
  REQUIRE(fd >= 0);
  // Only the inline bytes are written; the data records stay holes.
  REQUIRE(ftruncate(fd, static_cast<off_t>(layout->file_size)) == 0);
  for (const view::Segment& s : layout->file.segments()) {
    if (s.kind != view::Segment::Kind::kInline) continue;
    const std::string blob = layout->file.blobs()[s.index].ToString().value();
    REQUIRE(pwrite(fd, blob.data() + s.source_offset, s.length, static_cast<off_t>(s.offset)) ==
            static_cast<ssize_t>(s.length));
  }
  close(fd);
  auto file = MappedFile::Open(path);
  unlink(path.c_str());
  REQUIRE(file.ok());
  auto records = ReadZipDirectory(file->data(), file->size());
  REQUIRE(records.ok());
  REQUIRE(records->size() == entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    CHECK((*records)[i].size == entries[i].size);
    CHECK((*records)[i].data_offset == layout->data_offsets[i]);
    CHECK((*records)[i].local_header_offset == layout->local_header_offsets[i]);
  }
  CHECK((*records)[2].local_header_offset > 0xFFFFFFFFu);
}

}  // namespace
}  // namespace reshard::format
