#include "reshard/view/virtual_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "reshard/base/checked_math.h"

namespace reshard::view {
namespace {

std::string SegmentName(size_t i, const Segment& s) {
  return "segment " + std::to_string(i) + " [" + std::to_string(s.offset) + ", +" +
         std::to_string(s.length) + ")";
}

}  // namespace

Result<VirtualFile> VirtualFile::Create(std::vector<Segment> segments,
                                        std::vector<std::string> blobs) {
  uint64_t end = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& s = segments[i];
    // Zero-length segments would make "the segment holding byte k" ambiguous for the binary
    // search, so a canonical table has none.
    if (s.length == 0) return InvalidArgument(SegmentName(i, s) + " has length 0");
    if (s.offset != end) {
      return InvalidArgument(SegmentName(i, s) + " does not start at " + std::to_string(end) +
                             ", where the previous segment ends (gap, overlap or unsorted)");
    }
    const std::optional<uint64_t> next = CheckedAdd(s.offset, s.length);
    if (!next) return InvalidArgument(SegmentName(i, s) + " ends past UINT64_MAX");
    switch (s.kind) {
      case Segment::Kind::kInline:
        if (s.index >= blobs.size()) {
          return InvalidArgument(SegmentName(i, s) + " names blob " + std::to_string(s.index) +
                                 " of " + std::to_string(blobs.size()));
        }
        if (!RangeFits(s.source_offset, s.length, blobs[s.index].size())) {
          return InvalidArgument(SegmentName(i, s) + " reads blob " + std::to_string(s.index) +
                                 " at " + std::to_string(s.source_offset) + " past its " +
                                 std::to_string(blobs[s.index].size()) + " bytes");
        }
        break;
      case Segment::Kind::kData:
        // Record lengths are the builder's business; only rule out offsets that would wrap when
        // Read() adds the position inside the segment.
        if (!CheckedAdd(s.source_offset, s.length)) {
          return InvalidArgument(SegmentName(i, s) + " reads record " + std::to_string(s.index) +
                                 " at " + std::to_string(s.source_offset) +
                                 " past UINT64_MAX");
        }
        break;
      case Segment::Kind::kZero:
        break;
      default:
        return InvalidArgument(SegmentName(i, s) + " has unknown kind " +
                               std::to_string(static_cast<int>(s.kind)));
    }
    end = *next;
  }
  // A served file lives as long as the mount: the growth slack of the builders' vectors and
  // strings (up to half of each) is not kept with it.
  segments.shrink_to_fit();
  std::vector<CompressedBytes> held;
  held.reserve(blobs.size());
  for (std::string& blob : blobs) {
    RS_ASSIGN_OR_RETURN(CompressedBytes compressed, CompressedBytes::Create(blob));
    held.push_back(std::move(compressed));
    std::string().swap(blob);  // the plain bytes go as soon as their compressed copy is made
  }
  return VirtualFile(std::move(segments), std::move(held), end);
}

Result<size_t> VirtualFile::Read(uint64_t offset, uint8_t* out, size_t length,
                                 const DataFill& fill) const {
  if (offset >= size_ || length == 0) return size_t{0};
  const uint64_t total = std::min<uint64_t>(length, size_ - offset);
  // The segment holding `offset` is the last one starting at or before it; segment 0 starts at
  // 0 <= offset, so upper_bound never returns begin().
  auto it = std::upper_bound(segments_.begin(), segments_.end(), offset,
                             [](uint64_t off, const Segment& s) { return off < s.offset; });
  --it;
  uint64_t pos = offset;
  uint64_t done = 0;
  while (done < total) {
    const Segment& s = *it;
    const uint64_t within = pos - s.offset;
    const uint64_t n = std::min(s.length - within, total - done);
    uint8_t* dst = out + done;
    switch (s.kind) {
      case Segment::Kind::kInline:
        RS_RETURN_IF_ERROR(blobs_[s.index].Read(s.source_offset + within, dst, n));
        break;
      case Segment::Kind::kData:
        RS_RETURN_IF_ERROR(fill(s.index, s.source_offset + within, dst, n));
        break;
      case Segment::Kind::kZero:
        std::memset(dst, 0, n);
        break;
    }
    done += n;
    pos += n;
    ++it;
  }
  return static_cast<size_t>(total);
}

Status WriteAll(const VirtualFile& file, const DataFill& fill, int fd) {
  // One bounded buffer: files of many GiB (zip64 tests, tools) must not be held in memory.
  std::vector<uint8_t> buffer(kWriteAllChunkBytes);
  uint64_t offset = 0;
  while (offset < file.size()) {
    RS_ASSIGN_OR_RETURN(const size_t n, file.Read(offset, buffer.data(), buffer.size(), fill));
    size_t written = 0;
    while (written < n) {
      // write(2) may be short (pipes, signals); loop until the chunk is out.
      const ssize_t w = ::write(fd, buffer.data() + written, n - written);
      if (w < 0) {
        if (errno == EINTR) continue;
        return ErrnoError("write at virtual offset " + std::to_string(offset + written), errno);
      }
      written += static_cast<size_t>(w);
    }
    offset += n;
  }
  return Status::Ok();
}

Result<std::string> ReadAll(const VirtualFile& file, const DataFill& fill) {
  std::string out;
  if (file.size() > out.max_size()) {
    return ResourceExhausted("virtual file of " + std::to_string(file.size()) +
                             " bytes does not fit in memory");
  }
  out.resize(static_cast<size_t>(file.size()));
  RS_ASSIGN_OR_RETURN(const size_t n,
                      file.Read(0, reinterpret_cast<uint8_t*>(out.data()), out.size(), fill));
  if (n != out.size()) {
    return Internal("read " + std::to_string(n) + " of " + std::to_string(out.size()) + " bytes");
  }
  return out;
}

}  // namespace reshard::view
