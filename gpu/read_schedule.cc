#include "gpu/read_schedule.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "reshard/base/checked_math.h"
#include "reshard/format/dtype.h"

namespace reshard::gpu {
namespace {

uint64_t OutputBytes(uint64_t source_bytes, plan::Conversion c) {
  return c == plan::Conversion::kCopy ? source_bytes : source_bytes / 2;
}

Status CheckDtypes(const plan::StoragePlan& s, const plan::Source& src) {
  const bool ok = s.conversion == plan::Conversion::kCopy
                      ? s.dtype == src.dtype
                      : src.dtype == format::DType::kFloat32 &&
                            s.dtype == (s.conversion == plan::Conversion::kFp32ToBf16 ? format::DType::kBFloat16
                                                                                      : format::DType::kFloat16);
  if (ok) return Status();
  return InvalidArgument("storage '" + s.key + "' (" + std::string(format::TorchName(s.dtype)) + ") cannot be filled from " +
                         src.path + " (" + std::string(format::TorchName(src.dtype)) + ") by its conversion");
}

}  // namespace

Status SourceFileTable::Add(const std::vector<plan::Source>& sources) {
  for (const plan::Source& s : sources) {
    auto [it, inserted] = index_.emplace(s.path, static_cast<uint32_t>(files_.size()));
    if (inserted && s.computed) {  // bytes held in memory: a file that is never opened
      files_.emplace_back();
      paths_.push_back(s.path);
      sizes_.push_back(s.computed->size());
      computed_.push_back(s.computed);
    } else if (inserted) {
      UniqueFd fd(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoError("open " + s.path, errno);
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0) return ErrnoError("fstat " + s.path, errno);
      files_.push_back(std::move(fd));
      paths_.push_back(s.path);
      sizes_.push_back(static_cast<uint64_t>(st.st_size));
      computed_.emplace_back();
    }
    const uint64_t size = sizes_[it->second];
    const std::optional<uint64_t> bytes = CheckedMul(s.numel, format::ItemSize(s.dtype));
    const std::optional<uint64_t> end = bytes ? CheckedAdd(s.data_offset, *bytes) : std::nullopt;
    if (!end || *end > size) {
      return Corrupt(s.path + ": " + std::to_string(s.numel) + " elements at byte " + std::to_string(s.data_offset) +
                     " run past the file's " + std::to_string(size) + " bytes");
    }
  }
  return Status();
}

Result<const uint8_t*> SourceFileTable::ComputedBytes(uint32_t file, uint64_t offset, uint64_t length) const {
  const std::string& bytes = *computed_[file];
  if (offset > bytes.size() || length > bytes.size() - offset) {
    return OutOfRange(paths_[file] + ": bytes [" + std::to_string(offset) + ", +" + std::to_string(length) +
                      ") past its " + std::to_string(bytes.size()) + " computed bytes");
  }
  return reinterpret_cast<const uint8_t*>(bytes.data()) + offset;
}

Status SourceFileTable::PreadAll(uint32_t file, uint64_t offset, uint64_t length, struct iovec* iov,
                                 size_t count) const {
  // preadv may stop early (a signal, a file cut short): go on from the first unfinished buffer.
  uint64_t done = 0;
  size_t first = 0;
  while (done < length) {
    const ssize_t n = ::preadv(files_[file].get(), iov + first, static_cast<int>(count - first),
                               static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("preadv " + paths_[file] + " at byte " + std::to_string(offset + done), errno);
    if (n == 0) {
      return IoError(paths_[file] + ": the file ends before byte " + std::to_string(offset + length) +
                     " (truncated after the plan was made?)");
    }
    done += static_cast<uint64_t>(n);
    for (uint64_t left = static_cast<uint64_t>(n); left > 0;) {
      struct iovec& v = iov[first];
      const uint64_t take = std::min<uint64_t>(left, v.iov_len);
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + take;
      v.iov_len -= take;
      left -= take;
      if (v.iov_len == 0) ++first;
    }
  }
  return Status();
}

Status SourceFileTable::Read(uint32_t file, uint64_t offset, uint64_t length, uint8_t* out) const {
  if (computed_[file]) {
    RS_ASSIGN_OR_RETURN(const uint8_t* bytes, ComputedBytes(file, offset, length));
    std::memcpy(out, bytes, length);
    return Status();
  }
  struct iovec whole = {out, length};
  return PreadAll(file, offset, length, &whole, 1);
}

Status SourceFileTable::ReadInto(uint32_t file, uint64_t offset, uint64_t length, const CopyOp* ops, size_t count,
                                 uint8_t* scratch, std::vector<struct iovec>& iov) const {
  if (computed_[file]) {
    RS_ASSIGN_OR_RETURN(const uint8_t* bytes, ComputedBytes(file, offset, length));
    for (size_t i = 0; i < count; ++i) std::memcpy(ops[i].dest, bytes + ops[i].staging_offset, ops[i].source_bytes);
    return Status();
  }
  iov.clear();
  uint64_t at = 0;  // chunk bytes laid out so far
  for (size_t i = 0; i < count; ++i) {
    if (ops[i].staging_offset > at) iov.push_back({scratch, ops[i].staging_offset - at});
    iov.push_back({ops[i].dest, ops[i].source_bytes});
    at = ops[i].staging_offset + ops[i].source_bytes;
  }
  if (at < length) iov.push_back({scratch, length - at});
  return PreadAll(file, offset, length, iov.data(), iov.size());
}

bool DirectReadable(const CopyOp* ops, size_t count) {
  uint64_t end = 0;
  size_t buffers = 1;  // the tail after the last piece
  for (size_t i = 0; i < count; ++i) {
    if (ops[i].conversion != plan::Conversion::kCopy || ops[i].staging_offset < end) return false;
    buffers += ops[i].staging_offset > end ? 2 : 1;
    end = ops[i].staging_offset + ops[i].source_bytes;
  }
  return count > 0 && buffers <= IOV_MAX;
}

Status AppendPieces(const std::vector<plan::Source>& sources, const SourceFileTable& files,
                    const std::vector<const plan::StoragePlan*>& storages, uint32_t rank, uint64_t max_piece,
                    std::vector<Piece>& pieces, std::vector<ZeroPiece>& zeros) {
  for (uint32_t d = 0; d < storages.size(); ++d) {
    if (storages[d] == nullptr) return InvalidArgument("executor: a destination without a storage plan");
    const plan::StoragePlan& s = *storages[d];
    if (plan::NumElements(s.extents) != s.numel) {
      return InvalidArgument("storage '" + s.key + "': extents cover " + std::to_string(plan::NumElements(s.extents)) +
                             " of its " + std::to_string(s.numel) + " elements");
    }
    const uint64_t out_item = format::ItemSize(s.dtype);
    uint64_t dest_elem = 0;
    for (const plan::Extent& e : s.extents) {
      const view::Gather& g = e.gather;
      if (g.zero) {
        zeros.push_back({d, dest_elem * out_item, g.numel() * out_item});
        dest_elem += g.numel();
        continue;
      }
      if (e.source >= sources.size()) return InvalidArgument("storage '" + s.key + "': an extent names a missing source");
      const plan::Source& src = sources[e.source];
      RS_RETURN_IF_ERROR(CheckDtypes(s, src));
      const uint64_t in_item = format::ItemSize(src.dtype);
      const std::optional<uint64_t> last_row = CheckedMul(g.rows - 1, g.row_stride);
      const std::optional<uint64_t> span = last_row ? CheckedAdd(*last_row, g.row_elems) : std::nullopt;
      const std::optional<uint64_t> end = span ? CheckedAdd(g.start, *span) : std::nullopt;
      if (!end || *end > src.numel) {
        return InvalidArgument("storage '" + s.key + "': an extent reads past the " + std::to_string(src.numel) +
                               " elements of " + src.path);
      }
      const uint32_t file = files.FileOf(src.path);
      for (uint64_t r = 0; r < g.rows; ++r) {
        uint64_t offset = src.data_offset + (g.start + r * g.row_stride) * in_item;
        uint64_t left = g.row_elems * in_item;
        if (s.conversion != plan::Conversion::kCopy && offset % 4 != 0) {
          return InvalidArgument(src.path + ": float32 data at byte " + std::to_string(offset) + " is not 4-aligned");
        }
        uint64_t dest_offset = dest_elem * out_item;
        while (left > 0) {
          const uint64_t n = std::min(left, max_piece);
          pieces.push_back({file, offset, n, rank, d, dest_offset, s.conversion});
          dest_offset += OutputBytes(n, s.conversion);
          offset += n;
          left -= n;
        }
        dest_elem += g.row_elems;
      }
    }
  }
  return Status();
}

std::vector<Chunk> MergeIntoChunks(std::vector<Piece>& pieces, uint64_t chunk_bytes, uint64_t max_gap_bytes) {
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  });
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const uint64_t p_end = p.offset + p.length;
    if (!chunks.empty()) {
      Chunk& c = chunks.back();
      const uint64_t c_end = c.offset + c.length;
      const uint64_t new_end = std::max(c_end, p_end);
      if (c.file == p.file && p.offset <= c_end + max_gap_bytes && new_end - c.offset <= chunk_bytes) {
        c.length = new_end - c.offset;
        ++c.piece_count;
        continue;
      }
    }
    Chunk c;
    c.file = p.file;
    c.offset = p.offset / kChunkAlign * kChunkAlign;
    c.length = p_end - c.offset;
    c.first_piece = i;
    c.piece_count = 1;
    chunks.push_back(c);
  }
  return chunks;
}

Status RunLanes(const SourceFileTable& files, const std::vector<ChunkWork>& work, size_t lanes, CopyBackend& backend) {
  lanes = std::max<size_t>(1, std::min(lanes, work.size()));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  Status first_error;
  const bool direct = backend.ReadsIntoDestinations();
  auto lane_main = [&](size_t lane) {
    int slot = 0;
    std::vector<struct iovec> iov;
    for (size_t i = next++; i < work.size() && !failed; i = next++) {
      const ChunkWork& c = work[i];
      Status s = backend.WaitSlot(lane, slot);
      if (s.ok() && direct && c.direct) {
        // The gaps land in the slot's staging, which nothing reads: no copy out of it follows.
        s = files.ReadInto(c.file, c.offset, c.length, c.ops, c.op_count, backend.Staging(lane, slot), iov);
      } else {
        if (s.ok()) s = files.Read(c.file, c.offset, c.length, backend.Staging(lane, slot));
        if (s.ok()) s = backend.Scatter(lane, slot, c.ops, c.op_count);
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (first_error.ok()) first_error = std::move(s);
        failed = true;
        return;
      }
      slot ^= 1;
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(lanes);
  for (size_t lane = 0; lane < lanes; ++lane) threads.emplace_back(lane_main, lane);
  for (std::thread& t : threads) t.join();
  return first_error;
}

}  // namespace reshard::gpu
