#include "reshard/format/zip_writer.h"

#include <zlib.h>

#include <string_view>
#include <unordered_map>
#include <utility>

#include "reshard/base/checked_math.h"
#include "reshard/format/zip_format.h"

namespace reshard::format {
namespace {

using zip::AppendLe16;
using zip::AppendLe32;
using zip::AppendLe64;

constexpr uint32_t kMaxAlignment = 65536;
constexpr size_t kMaxNameLength = 0xFFFF;
constexpr uint64_t kEndRecordsSize =
    zip::kZip64EocdSize + zip::kZip64LocatorSize + zip::kEocdSize;

uint32_t Crc32Of(const std::string& bytes) {
  // zlib takes uInt lengths, so feed it in chunks that fit any uInt.
  constexpr size_t kChunk = size_t{1} << 30;
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {
    const size_t n = left < kChunk ? left : kChunk;
    crc = crc32(crc, p, static_cast<uInt>(n));
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

// miniz compares names with MZ_TOLOWER, an ASCII-only fold; do the same.
std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// A 32-bit directory field: the value, or the zip64 marker when the value needs 64 bits.
uint32_t Clamp32(uint64_t v) {
  return v >= zip::kMarker32 ? zip::kMarker32 : static_cast<uint32_t>(v);
}

// Where one record lands; computed before any byte is emitted, so that the offsets callers get
// and the bytes we emit come from one set of formulas.
struct RecordPlan {
  uint64_t local_header_offset = 0;
  uint64_t data_offset = 0;
  uint32_t padding = 0;        // 'Z' bytes in the FB extra
  bool zip64_size = false;     // size >= 0xFFFFFFFF
  bool zip64_offset = false;   // local header offset >= 0xFFFFFFFF
  uint16_t flags = 0;
  uint32_t crc32 = 0;
};

// Accumulates inline bytes and emits one kInline segment per run between data segments, so a
// file has about as many segments as it has data records. Every run lives in one blob: a blob
// per run cost a string header, a heap block and its growth slack per record, about twice the
// bytes the records hold.
class SegmentBuilder {
 public:
  std::string& inline_bytes() { return inline_; }
  // The offset of the next byte appended.
  uint64_t end_offset() const { return offset_ + (inline_.size() - flushed_); }

  void AppendData(uint32_t record, uint64_t length) {
    Flush();
    if (length == 0) return;
    segments_.push_back({offset_, length, view::Segment::Kind::kData, record, 0});
    offset_ += length;  // the caller checked every offset of the plan
  }

  Result<view::VirtualFile> Finish() {
    Flush();
    std::vector<std::string> blobs;
    if (!inline_.empty()) blobs.push_back(std::move(inline_));
    return view::VirtualFile::Create(std::move(segments_), std::move(blobs));
  }

 private:
  void Flush() {
    const size_t run = inline_.size() - flushed_;
    if (run == 0) return;
    segments_.push_back({offset_, run, view::Segment::Kind::kInline, 0, flushed_});
    offset_ += run;
    flushed_ = inline_.size();
  }

  std::vector<view::Segment> segments_;
  std::string inline_;  // the inline bytes of every run, in file order
  size_t flushed_ = 0;  // inline_[0, flushed_) already has its segments
  uint64_t offset_ = 0;
};

std::string EntryName(size_t i, const ZipEntry& e) {
  return "entry " + std::to_string(i) + " '" + e.name + "'";
}

Status ValidateEntries(const std::vector<ZipEntry>& entries, uint32_t alignment) {
  if (alignment == 0 || alignment > kMaxAlignment) {
    return InvalidArgument("zip alignment " + std::to_string(alignment) +
                           " is outside [1, 65536]");
  }
  if (entries.size() >= UINT32_MAX) {
    return InvalidArgument(std::to_string(entries.size()) +
                           " zip entries exceed the 4294967294 a record id can name");
  }
  // torch's miniz finds records by a case-insensitive name compare, so names equal up to case
  // would shadow each other on load.
  std::unordered_map<std::string, size_t> seen;  // lower-cased name -> entry index
  seen.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const ZipEntry& e = entries[i];
    if (e.name.empty()) {
      return InvalidArgument("entry " + std::to_string(i) + " has an empty name");
    }
    if (e.name.size() > kMaxNameLength) {
      return InvalidArgument("entry " + std::to_string(i) + " has a name of " +
                             std::to_string(e.name.size()) + " bytes (at most 65535)");
    }
    if (e.content && e.content->size() != e.size) {
      return InvalidArgument(EntryName(i, e) + " declares " + std::to_string(e.size) +
                             " bytes but its content has " + std::to_string(e.content->size()));
    }
    auto [it, inserted] = seen.emplace(AsciiLower(e.name), i);
    if (!inserted) {
      return InvalidArgument(EntryName(i, e) + " duplicates " +
                             EntryName(it->second, entries[it->second]) +
                             " (torch looks records up ignoring case)");
    }
  }
  return Status::Ok();
}

Status Overflow(size_t i, const ZipEntry& e) {
  return InvalidArgument(EntryName(i, e) + " of " + std::to_string(e.size) +
                         " bytes: archive offsets pass UINT64_MAX");
}

struct ArchivePlan {
  std::vector<RecordPlan> records;
  uint64_t central_directory_offset = 0;
};

// Offsets, padding and flags of every record, following torch_format.md §2.
Result<ArchivePlan> PlanRecords(const std::vector<ZipEntry>& entries, uint32_t alignment) {
  ArchivePlan plan;
  std::vector<RecordPlan>& plans = plan.records;
  plans.resize(entries.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ZipEntry& e = entries[i];
    RecordPlan& p = plans[i];
    p.local_header_offset = offset;
    // miniz switches to zip64 at >= 0xFFFFFFFF: the marker value itself is never a real value.
    p.zip64_size = e.size >= zip::kMarker32;
    p.zip64_offset = offset >= zip::kMarker32;
    // miniz writes the header before the data and the CRC after it (bit 3), except for an empty
    // record, whose CRC (0) and size are known up front and which gets no descriptor.
    p.flags = e.size > 0 ? (zip::kFlagUtf8 | zip::kFlagDataDescriptor) : zip::kFlagUtf8;
    const uint64_t zip64_extra = (p.zip64_size || p.zip64_offset)
                                     ? zip::kExtraHeaderSize + (p.zip64_size ? 16 : 0) +
                                           (p.zip64_offset ? 8 : 0)
                                     : 0;
    // Fixed header, name, zip64 extra, then the FB extra's own 4-byte header before the padding.
    const uint64_t before_padding =
        zip::kLocalHeaderSize + e.name.size() + zip64_extra + zip::kExtraHeaderSize;
    const std::optional<uint64_t> start = CheckedAdd(offset, before_padding);
    if (!start) return Overflow(i, e);
    p.padding = static_cast<uint32_t>((alignment - *start % alignment) % alignment);
    const uint64_t extra_len = zip64_extra + zip::kExtraHeaderSize + p.padding;
    if (extra_len > zip::kMaxExtraLength) {
      return InvalidArgument(EntryName(i, e) + ": padding of " + std::to_string(p.padding) +
                             " bytes for alignment " + std::to_string(alignment) +
                             " overflows the 65535-byte extra field");
    }
    const std::optional<uint64_t> data = CheckedAdd(*start, p.padding);
    if (!data) return Overflow(i, e);
    p.data_offset = *data;
    // The descriptor is 64-bit exactly when the local header got a zip64 extra (for either
    // reason), as miniz decides it from the header it already wrote.
    const uint64_t descriptor =
        e.size == 0 ? 0
                    : (zip64_extra ? zip::kDataDescriptorZip64Size : zip::kDataDescriptorSize);
    const std::optional<uint64_t> data_end = CheckedAdd(p.data_offset, e.size);
    const std::optional<uint64_t> next = data_end ? CheckedAdd(*data_end, descriptor) : data_end;
    if (!next) return Overflow(i, e);
    offset = *next;
    p.crc32 = e.content ? Crc32Of(*e.content) : 0;
  }
  plan.central_directory_offset = offset;
  return plan;
}

void AppendLocalHeader(std::string& out, const ZipEntry& e, const RecordPlan& p) {
  const uint16_t zip64_len = (p.zip64_size ? 16 : 0) + (p.zip64_offset ? 8 : 0);
  const uint16_t zip64_extra = zip64_len ? zip::kExtraHeaderSize + zip64_len : 0;
  AppendLe32(out, zip::kLocalHeaderSignature);
  AppendLe16(out, 0);  // version needed: miniz writes 0 for stored records
  AppendLe16(out, p.flags);
  AppendLe16(out, zip::kMethodStored);
  AppendLe32(out, 0);  // DOS time and date: torch passes no timestamp
  AppendLe32(out, 0);  // CRC-32: in the descriptor (flag bit 3)
  AppendLe32(out, 0);  // compressed size: likewise
  AppendLe32(out, 0);  // uncompressed size: likewise
  AppendLe16(out, static_cast<uint16_t>(e.name.size()));
  AppendLe16(out, static_cast<uint16_t>(zip64_extra + zip::kExtraHeaderSize + p.padding));
  out += e.name;
  if (zip64_len) {
    AppendLe16(out, zip::kZip64ExtraId);
    AppendLe16(out, zip64_len);
    // miniz writes the local zip64 sizes before the data exists: size, then compressed 0.
    if (p.zip64_size) {
      AppendLe64(out, e.size);
      AppendLe64(out, 0);
    }
    if (p.zip64_offset) AppendLe64(out, p.local_header_offset);
  }
  AppendLe16(out, zip::kPaddingExtraId);
  AppendLe16(out, static_cast<uint16_t>(p.padding));
  out.append(p.padding, static_cast<char>(zip::kPaddingByte));
}

void AppendDescriptor(std::string& out, const ZipEntry& e, const RecordPlan& p) {
  if (e.size == 0) return;
  AppendLe32(out, zip::kDataDescriptorSignature);
  AppendLe32(out, p.crc32);
  if (p.zip64_size || p.zip64_offset) {  // 64-bit sizes, matching the planned length
    AppendLe64(out, e.size);
    AppendLe64(out, e.size);
  } else {
    AppendLe32(out, static_cast<uint32_t>(e.size));
    AppendLe32(out, static_cast<uint32_t>(e.size));
  }
}

void AppendCentralEntry(std::string& out, const ZipEntry& e, const RecordPlan& p) {
  const uint16_t zip64_len = (p.zip64_size ? 16 : 0) + (p.zip64_offset ? 8 : 0);
  AppendLe32(out, zip::kCentralHeaderSignature);
  AppendLe16(out, 0);  // version made by
  AppendLe16(out, 0);  // version needed
  AppendLe16(out, p.flags);
  AppendLe16(out, zip::kMethodStored);
  AppendLe32(out, 0);  // DOS time and date
  AppendLe32(out, p.crc32);
  AppendLe32(out, Clamp32(e.size));  // compressed
  AppendLe32(out, Clamp32(e.size));  // uncompressed
  AppendLe16(out, static_cast<uint16_t>(e.name.size()));
  AppendLe16(out, static_cast<uint16_t>(zip64_len ? zip::kExtraHeaderSize + zip64_len : 0));
  AppendLe16(out, 0);  // comment length
  AppendLe16(out, 0);  // disk start
  AppendLe16(out, 0);  // internal attributes
  AppendLe32(out, 0);  // external attributes
  AppendLe32(out, Clamp32(p.local_header_offset));
  out += e.name;
  if (zip64_len) {
    AppendLe16(out, zip::kZip64ExtraId);
    AppendLe16(out, zip64_len);
    if (p.zip64_size) {
      AppendLe64(out, e.size);  // uncompressed
      AppendLe64(out, e.size);  // compressed
    }
    if (p.zip64_offset) AppendLe64(out, p.local_header_offset);
  }
}

void AppendEndRecords(std::string& out, uint64_t entries, uint64_t cd_offset, uint64_t cd_size) {
  const uint64_t zip64_eocd = cd_offset + cd_size;
  AppendLe32(out, zip::kZip64EocdSignature);
  AppendLe64(out, zip::kZip64EocdRemainingSize);
  AppendLe16(out, zip::kZip64VersionMadeBy);
  AppendLe16(out, zip::kZip64VersionNeeded);
  AppendLe32(out, 0);  // this disk
  AppendLe32(out, 0);  // disk with the central directory
  AppendLe64(out, entries);
  AppendLe64(out, entries);
  AppendLe64(out, cd_size);
  AppendLe64(out, cd_offset);

  AppendLe32(out, zip::kZip64LocatorSignature);
  AppendLe32(out, 0);  // disk with the zip64 EOCD
  AppendLe64(out, zip64_eocd);
  AppendLe32(out, 1);  // total disks

  const auto entries16 =
      static_cast<uint16_t>(entries >= zip::kMarker16 ? zip::kMarker16 : entries);
  AppendLe32(out, zip::kEocdSignature);
  AppendLe16(out, 0);  // this disk
  AppendLe16(out, 0);  // disk with the central directory
  AppendLe16(out, entries16);
  AppendLe16(out, entries16);
  AppendLe32(out, Clamp32(cd_size));
  AppendLe32(out, Clamp32(cd_offset));
  AppendLe16(out, 0);  // comment length
}

}  // namespace

Result<ZipLayout> LayoutZip(const std::vector<ZipEntry>& entries, uint32_t alignment) {
  RS_RETURN_IF_ERROR(ValidateEntries(entries, alignment));
  RS_ASSIGN_OR_RETURN(const ArchivePlan plan, PlanRecords(entries, alignment));
  const std::vector<RecordPlan>& plans = plan.records;
  const uint64_t cd_offset = plan.central_directory_offset;

  SegmentBuilder builder;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ZipEntry& e = entries[i];
    AppendLocalHeader(builder.inline_bytes(), e, plans[i]);
    // The emitted bytes must agree with the plan that callers get offsets from.
    if (builder.end_offset() != plans[i].data_offset) {
      return Internal(EntryName(i, e) + ": data emitted at " +
                      std::to_string(builder.end_offset()) + " but planned at " +
                      std::to_string(plans[i].data_offset));
    }
    if (e.content) {
      builder.inline_bytes() += *e.content;
    } else {
      builder.AppendData(static_cast<uint32_t>(i), e.size);
    }
    AppendDescriptor(builder.inline_bytes(), e, plans[i]);
  }
  // The directory and end records follow the last record contiguously: Python's zipfile infers
  // "prepended data" from any gap between the directory end and the zip64 EOCD.
  std::string& tail = builder.inline_bytes();
  const size_t cd_start = tail.size();
  for (size_t i = 0; i < entries.size(); ++i) AppendCentralEntry(tail, entries[i], plans[i]);
  const uint64_t cd_size = tail.size() - cd_start;
  const std::optional<uint64_t> cd_end = CheckedAdd(cd_offset, cd_size);
  const std::optional<uint64_t> file_size =
      cd_end ? CheckedAdd(*cd_end, kEndRecordsSize) : cd_end;
  if (!file_size) {
    return InvalidArgument("zip central directory of " + std::to_string(cd_size) +
                           " bytes at offset " + std::to_string(cd_offset) +
                           " ends past UINT64_MAX");
  }
  AppendEndRecords(tail, entries.size(), cd_offset, cd_size);

  ZipLayout layout;
  RS_ASSIGN_OR_RETURN(layout.file, builder.Finish());
  if (layout.file.size() != *file_size) {
    return Internal("zip layout emitted " + std::to_string(layout.file.size()) +
                    " bytes but planned " + std::to_string(*file_size));
  }
  layout.file_size = *file_size;
  layout.central_directory_offset = cd_offset;
  layout.central_directory_size = cd_size;
  layout.local_header_offsets.reserve(plans.size());
  layout.data_offsets.reserve(plans.size());
  layout.crc32s.reserve(plans.size());
  for (const RecordPlan& p : plans) {
    layout.local_header_offsets.push_back(p.local_header_offset);
    layout.data_offsets.push_back(p.data_offset);
    layout.crc32s.push_back(p.crc32);
  }
  return layout;
}

}  // namespace reshard::format
