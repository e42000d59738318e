#include "reshard/format/zip_writer.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "reshard/format/zip_format.h"
#include "reshard/format/zip_reader.h"

#include "tests/unit/hex.h"

namespace reshard::format {
namespace {

using reshard::testing::FromHex;

using view::Segment;

uint8_t PatternByte(uint32_t record, uint64_t offset) {
  return static_cast<uint8_t>(0x11 + record * 13 + offset * 3);
}

Status PatternFill(uint32_t record, uint64_t offset, uint8_t* out, size_t length) {
  for (size_t k = 0; k < length; ++k) out[k] = PatternByte(record, offset + k);
  return Status::Ok();
}

// For layouts too large to materialize: any data read fails the test.
Status NoData(uint32_t record, uint64_t, uint8_t*, size_t) {
  return Internal("unexpected read of data record " + std::to_string(record));
}

std::string ReadRange(const view::VirtualFile& file, uint64_t offset, size_t length) {
  std::string out(length, '\0');
  auto n = file.Read(offset, reinterpret_cast<uint8_t*>(out.data()), length, NoData);
  REQUIRE(n.ok());
  REQUIRE(*n == length);
  return out;
}

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// Written by torch 2.9.1:
//   w = torch._C.PyTorchFileWriter('g.zip', True, 64)   # compute_crc32=True, alignment 64
//   w.write_record('data.pkl', b'hello', 5); w.write_record('e', b'', 0)
//   w.write_record('version', b'3\n', 2); w.write_end_of_file()
// (writeEndOfFile adds byteorder and .data/serialization_id).
const char* const kTorchGoldenHex =
    "504b0304000008080000000000000000000000000000000000000a001800672f646174612e706b6c"
    "464214005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a68656c6c6f504b070886a61036050000"
    "0005000000504b03040000000800000000000000000000000000000000000003000a00672f654642"
    "06005a5a5a5a5a5a504b03040000080800000000000000000000000000000000000009001900672f"
    "76657273696f6e464215005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a330a504b0708d19e"
    "67550200000002000000504b0304000008080000000000000000000000000000000000000b000500"
    "672f627974656f72646572464201005a6c6974746c65504b0708853de3190600000006000000504b"
    "03040000080800000000000000000000000000000000000018003400672f2e646174612f73657269"
    "616c697a6174696f6e5f6964464230005a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a"
    "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a30353733353335373637353434383636"
    "303437333030303030303135333739373232373938323537504b0708650bbcb62800000028000000"
    "504b010200000000080800000000000086a6103605000000050000000a0000000000000000000000"
    "000000000000672f646174612e706b6c504b01020000000000080000000000000000000000000000"
    "00000000030000000000000000000000000055000000672f65504b01020000000008080000000000"
    "00d19e67550200000002000000090000000000000000000000000080000000672f76657273696f6e"
    "504b0102000000000808000000000000853de31906000000060000000b0000000000000000000000"
    "0000d2000000672f627974656f72646572504b0102000000000808000000000000650bbcb6280000"
    "0028000000180000000000000000000000000016010000672f2e646174612f73657269616c697a61"
    "74696f6e5f6964504b06062c000000000000001e032d000000000000000000050000000000000005"
    "000000000000001f01000000000000b801000000000000504b060700000000d70200000000000001"
    "000000504b050600000000050005001f010000b80100000000";

std::vector<ZipEntry> GoldenEntries() {
  return {{"g/data.pkl", 5, "hello"},
          {"g/e", 0, ""},
          {"g/version", 2, "3\n"},
          {"g/byteorder", 6, "little"},
          {"g/.data/serialization_id", 40, "0573535767544866047300000015379722798257"}};
}

TEST_CASE("LayoutZip: metadata records reproduce torch.save bytes exactly", "[format]") {
  const std::string golden = FromHex(kTorchGoldenHex);
  REQUIRE(golden.size() == 825);
  auto layout = LayoutZip(GoldenEntries());
  REQUIRE(layout.ok());
  CHECK(layout->file_size == golden.size());
  CHECK(layout->data_offsets == std::vector<uint64_t>{64, 128, 192, 256, 384});
  CHECK(layout->local_header_offsets == std::vector<uint64_t>{0, 85, 128, 210, 278});
  CHECK(layout->crc32s == std::vector<uint32_t>{0x3610a686, 0, 0x55679ed1, 0x19e33d85, 0xb6bc0b65});
  CHECK(layout->central_directory_offset == 0x1b8);
  CHECK(layout->central_directory_size == 0x11f);
  auto bytes = view::ReadAll(layout->file, NoData);
  REQUIRE(bytes.ok());
  CHECK(*bytes == golden);
  // Everything is metadata, so the whole file is inline.
  for (const Segment& s : layout->file.segments()) CHECK(s.kind == Segment::Kind::kInline);
}

TEST_CASE("LayoutZip: data records carry CRC 0, like torch with compute_crc32=False", "[format]") {
  // The same archive with every record supplied on read: identical except that each CRC field
  // (descriptor +4, central entry +16) is 0, which is what torch writes without CRCs.
  std::vector<ZipEntry> entries = GoldenEntries();
  for (ZipEntry& e : entries) e.content.reset();
  auto layout = LayoutZip(entries);
  REQUIRE(layout.ok());
  std::string expected = FromHex(kTorchGoldenHex);
  uint64_t cd_entry = layout->central_directory_offset;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].size > 0) {
      expected.replace(layout->data_offsets[i] + entries[i].size + 4, 4, 4, '\0');
    }
    expected.replace(cd_entry + zip::kCentralCrc32, 4, 4, '\0');
    cd_entry += zip::kCentralHeaderSize + entries[i].name.size();
  }
  const std::vector<ZipEntry> golden_entries = GoldenEntries();
  auto fill = [&](uint32_t record, uint64_t offset, uint8_t* out, size_t length) -> Status {
    golden_entries[record].content->copy(reinterpret_cast<char*>(out), length, offset);
    return Status::Ok();
  };
  auto bytes = view::ReadAll(layout->file, fill);
  REQUIRE(bytes.ok());
  CHECK(*bytes == expected);
  CHECK(layout->crc32s == std::vector<uint32_t>(5, 0));
  // One data segment per non-empty record, named by the entry index.
  std::vector<uint32_t> data_records;
  for (const Segment& s : layout->file.segments()) {
    if (s.kind == Segment::Kind::kData) data_records.push_back(s.index);
  }
  CHECK(data_records == std::vector<uint32_t>{0, 2, 3, 4});
}

TEST_CASE("LayoutZip: the reader finds every record of a written archive", "[format]") {
  for (const uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    CAPTURE(alignment);
    std::vector<ZipEntry> entries = {
        {"archive/data.pkl", 11, "pickle\x80\x02.xy"},
        {"archive/byteorder", 6, "little"},
        {"archive/data/0", 1000, std::nullopt},
        {"archive/data/1", 0, std::nullopt},
        {"archive/data/2", 77, std::nullopt},
        {"archive/data/3", 4097, std::nullopt},
        {"archive/version", 2, "3\n"},
    };
    auto layout = LayoutZip(entries, alignment);
    REQUIRE(layout.ok());
    auto bytes = view::ReadAll(layout->file, PatternFill);
    REQUIRE(bytes.ok());
    REQUIRE(bytes->size() == layout->file_size);
    auto records = ReadZipDirectory(Bytes(*bytes), bytes->size());
    REQUIRE(records.ok());
    REQUIRE(records->size() == entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const ZipRecord& r = (*records)[i];
      CAPTURE(entries[i].name);
      CHECK(r.name == entries[i].name);
      CHECK(r.size == entries[i].size);
      CHECK(r.data_offset == layout->data_offsets[i]);
      CHECK(r.data_offset % alignment == 0);
      CHECK(r.local_header_offset == layout->local_header_offsets[i]);
      CHECK(r.crc32 == layout->crc32s[i]);
      const std::string data = bytes->substr(r.data_offset, r.size);
      if (entries[i].content) {
        CHECK(data == *entries[i].content);
      } else {
        std::string want;
        for (uint64_t k = 0; k < r.size; ++k) {
          want.push_back(static_cast<char>(PatternByte(static_cast<uint32_t>(i), k)));
        }
        CHECK(data == want);
      }
    }
  }
}

TEST_CASE("LayoutZip: zip64 extras and end records past 4 GiB (layout only)", "[format]") {
  constexpr uint64_t kBig = uint64_t{5} << 30;
  const std::vector<ZipEntry> entries = {
      {"archive/data.pkl", 3, "pkl"},
      {"archive/data/0", kBig, std::nullopt},   // size needs zip64
      {"archive/data/1", 100, std::nullopt},    // offset needs zip64
      {"archive/data/2", 0, std::nullopt},      // empty, offset needs zip64
      {"archive/version", 2, "3\n"},
  };
  auto layout = LayoutZip(entries);
  REQUIRE(layout.ok());
  const view::VirtualFile& file = layout->file;
  const std::vector<uint64_t>& lho = layout->local_header_offsets;
  const std::vector<uint64_t>& data = layout->data_offsets;
  auto le16 = [](const std::string& s, size_t at) { return zip::LoadLe16(Bytes(s) + at); };
  auto le32 = [](const std::string& s, size_t at) { return zip::LoadLe32(Bytes(s) + at); };
  auto le64 = [](const std::string& s, size_t at) { return zip::LoadLe64(Bytes(s) + at); };

  // Big record: local zip64 extra = id 1, 16 bytes: u64 size, u64 0; then the FB field.
  const std::string big_local = ReadRange(file, lho[1], data[1] - lho[1]);
  CHECK(lho[1] < 0xFFFFFFFFu);
  CHECK(le16(big_local, zip::kLocalFlags) == 0x0808);
  const size_t big_extra = 30 + entries[1].name.size();
  CHECK(le16(big_local, zip::kLocalExtraLength) == data[1] - lho[1] - big_extra);
  CHECK(le16(big_local, big_extra) == 1);
  CHECK(le16(big_local, big_extra + 2) == 16);
  CHECK(le64(big_local, big_extra + 4) == kBig);
  CHECK(le64(big_local, big_extra + 12) == 0);
  CHECK(le16(big_local, big_extra + 20) == zip::kPaddingExtraId);
  // ... and a 24-byte descriptor.
  const std::string big_dd = ReadRange(file, data[1] + kBig, 24);
  CHECK(le32(big_dd, 0) == zip::kDataDescriptorSignature);
  CHECK(le32(big_dd, 4) == 0);
  CHECK(le64(big_dd, 8) == kBig);
  CHECK(le64(big_dd, 16) == kBig);
  CHECK(lho[2] == data[1] + kBig + 24);

  // Record after it: local zip64 extra = id 1, 8 bytes: u64 local header offset.
  CHECK(lho[2] >= 0xFFFFFFFFu);
  const std::string small_local = ReadRange(file, lho[2], data[2] - lho[2]);
  const size_t small_extra = 30 + entries[2].name.size();
  CHECK(le16(small_local, small_extra) == 1);
  CHECK(le16(small_local, small_extra + 2) == 8);
  CHECK(le64(small_local, small_extra + 4) == lho[2]);
  CHECK(le32(ReadRange(file, data[2] + 100, 24), 0) == zip::kDataDescriptorSignature);
  CHECK(lho[3] == data[2] + 100 + 24);
  CHECK(le16(ReadRange(file, lho[3], 30), zip::kLocalFlags) == 0x0800);  // empty: no descriptor
  CHECK(lho[4] == data[3]);

  // Central directory: markers in the fixed fields, real values in the zip64 extra.
  const uint64_t cd = layout->central_directory_offset;
  const std::string dir = ReadRange(file, cd, layout->central_directory_size + 98);
  std::vector<size_t> at;  // entry offsets inside `dir`
  for (size_t i = 0, pos = 0; i < entries.size(); ++i) {
    at.push_back(pos);
    pos += 46 + entries[i].name.size() + le16(dir, pos + zip::kCentralExtraLength);
  }
  CHECK(le16(dir, at[0] + zip::kCentralExtraLength) == 0);
  CHECK(le32(dir, at[1] + zip::kCentralCompressedSize) == 0xFFFFFFFFu);
  CHECK(le32(dir, at[1] + zip::kCentralUncompressedSize) == 0xFFFFFFFFu);
  CHECK(le32(dir, at[1] + zip::kCentralLocalHeaderOffset) == lho[1]);
  CHECK(le16(dir, at[1] + zip::kCentralExtraLength) == 20);
  CHECK(le64(dir, at[1] + 46 + entries[1].name.size() + 4) == kBig);
  CHECK(le64(dir, at[1] + 46 + entries[1].name.size() + 12) == kBig);
  for (size_t i : {2, 3, 4}) {
    CHECK(le32(dir, at[i] + zip::kCentralLocalHeaderOffset) == 0xFFFFFFFFu);
    CHECK(le16(dir, at[i] + zip::kCentralExtraLength) == 12);
    CHECK(le64(dir, at[i] + 46 + entries[i].name.size() + 4) == lho[i]);
  }
  // End records: zip64 EOCD, locator, EOCD with the offset clamped to the marker.
  const size_t z64 = layout->central_directory_size;
  CHECK(le32(dir, z64) == zip::kZip64EocdSignature);
  CHECK(le64(dir, z64 + 32) == entries.size());
  CHECK(le64(dir, z64 + 40) == layout->central_directory_size);
  CHECK(le64(dir, z64 + 48) == cd);
  CHECK(le32(dir, z64 + 56) == zip::kZip64LocatorSignature);
  CHECK(le64(dir, z64 + 64) == cd + layout->central_directory_size);
  CHECK(le32(dir, z64 + 76) == zip::kEocdSignature);
  CHECK(le16(dir, z64 + 76 + 10) == entries.size());
  CHECK(le32(dir, z64 + 76 + 12) == layout->central_directory_size);
  CHECK(le32(dir, z64 + 76 + 16) == 0xFFFFFFFFu);
  CHECK(layout->file_size == cd + layout->central_directory_size + 98);
  CHECK(file.size() == layout->file_size);
}

TEST_CASE("LayoutZip: a size of exactly 0xFFFFFFFF already needs zip64", "[format]") {
  auto layout = LayoutZip({{"a/x", 0xFFFFFFFFu, std::nullopt}, {"a/y", 0xFFFFFFFEu, std::nullopt}});
  REQUIRE(layout.ok());
  // x: zip64 size extra (4 + 16); y: its offset is past 0xFFFFFFFF, so zip64 offset extra (4 + 8).
  const std::string x = ReadRange(layout->file, 0, 30);
  CHECK(zip::LoadLe16(Bytes(x) + zip::kLocalExtraLength) == layout->data_offsets[0] - 30 - 3);
  CHECK(layout->data_offsets[0] == 64);
  CHECK(layout->local_header_offsets[1] == 64 + 0xFFFFFFFFull + 24);
  const std::string y = ReadRange(layout->file, layout->local_header_offsets[1], 40);
  CHECK(zip::LoadLe16(Bytes(y) + 33) == 1);
  CHECK(zip::LoadLe16(Bytes(y) + 35) == 8);
}

TEST_CASE("LayoutZip: refuses invalid entry lists", "[format]") {
  auto refuses = [](const std::vector<ZipEntry>& entries, uint32_t alignment,
                    const std::string& needle) {
    auto r = LayoutZip(entries, alignment);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(needle));
  };
  const std::vector<ZipEntry> one = {{"archive/version", 2, "3\n"}};
  refuses(one, 0, "alignment 0 is outside [1, 65536]");
  refuses(one, 65537, "alignment 65537 is outside [1, 65536]");
  refuses({{"", 1, std::nullopt}}, 64, "entry 0 has an empty name");
  refuses({{std::string(65536, 'n'), 1, std::nullopt}}, 64, "name of 65536 bytes");
  refuses({{"archive/data.pkl", 1, std::nullopt}, {"archive/DATA.pkl", 1, std::nullopt}}, 64,
          "entry 1 'archive/DATA.pkl' duplicates entry 0 'archive/data.pkl'");
  refuses({{"a/b", 1, std::nullopt}, {"a/b", 1, std::nullopt}}, 64, "duplicates");
  refuses({{"archive/version", 3, "3\n"}}, 64, "declares 3 bytes but its content has 2");
  refuses({{"a/x", UINT64_MAX - 100, std::nullopt}}, 64, "UINT64_MAX");
  refuses({{"a/x", UINT64_MAX / 2, std::nullopt}, {"a/y", UINT64_MAX / 2, std::nullopt}}, 64,
          "pass UINT64_MAX");
  // 30 + 65503 + 4 = 65537 needs 65535 bytes of padding: the extra field would be 65539 bytes.
  refuses({{std::string(65503, 'n'), 1, std::nullopt}}, 65536, "overflows the 65535-byte extra");
  CHECK(LayoutZip({{std::string(65502, 'n'), 1, std::nullopt}}, 65536).ok());
}

TEST_CASE("LayoutZip: an empty entry list is a valid empty archive", "[format]") {
  auto layout = LayoutZip({});
  REQUIRE(layout.ok());
  CHECK(layout->file_size == 98);
  CHECK(layout->central_directory_offset == 0);
  CHECK(layout->central_directory_size == 0);
}

}  // namespace
}  // namespace reshard::format
