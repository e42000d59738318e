#include "gpu/executor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "reshard/base/checked_math.h"
#include "reshard/format/dtype.h"

namespace reshard::gpu {
namespace {

constexpr uint64_t kAlign = 64;  // chunk starts; staging buffers are aligned the same way

struct Piece {
  uint32_t file = 0;
  uint64_t offset = 0;  // file bytes
  uint64_t length = 0;
  void* dest = nullptr;
  plan::Conversion conversion = plan::Conversion::kCopy;
};

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

Result<Executor> Executor::Create(const std::vector<plan::Source>& sources, const std::vector<Destination>& dests,
                                  const ExecutorOptions& options) {
  if (options.lanes < 1 || options.chunk_bytes < 2 * kAlign || options.chunk_bytes % kAlign != 0) {
    return InvalidArgument("executor options: lanes must be >= 1 and chunk_bytes a multiple of 64, >= 128");
  }
  Executor ex;
  ex.options_ = options;

  // Open each distinct file once and check it holds every source that names it.
  std::map<std::string, uint32_t> file_index;
  std::vector<uint64_t> file_sizes;
  std::vector<uint32_t> source_file(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const plan::Source& s = sources[i];
    auto [it, inserted] = file_index.emplace(s.path, static_cast<uint32_t>(ex.files_.size()));
    if (inserted) {
      UniqueFd fd(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoError("open " + s.path, errno);
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0) return ErrnoError("fstat " + s.path, errno);
      ex.files_.push_back(std::move(fd));
      ex.paths_.push_back(s.path);
      file_sizes.push_back(static_cast<uint64_t>(st.st_size));
    }
    source_file[i] = it->second;
    const std::optional<uint64_t> bytes = CheckedMul(s.numel, format::ItemSize(s.dtype));
    const std::optional<uint64_t> end = bytes ? CheckedAdd(s.data_offset, *bytes) : std::nullopt;
    if (!end || *end > file_sizes[it->second]) {
      return Corrupt(s.path + ": " + std::to_string(s.numel) + " elements at byte " + std::to_string(s.data_offset) +
                     " run past the file's " + std::to_string(file_sizes[it->second]) + " bytes");
    }
  }

  // Every run of every destination: a piece to read, or zeros to write.
  const uint64_t max_piece = options.chunk_bytes - kAlign;  // room for aligning the chunk start down
  std::vector<Piece> pieces;
  for (const Destination& d : dests) {
    if (d.storage == nullptr || (d.data == nullptr && d.storage->numel > 0)) {
      return InvalidArgument("executor: a destination without storage plan or buffer");
    }
    const plan::StoragePlan& s = *d.storage;
    if (plan::NumElements(s.extents) != s.numel) {
      return InvalidArgument("storage '" + s.key + "': extents cover " + std::to_string(plan::NumElements(s.extents)) +
                             " of its " + std::to_string(s.numel) + " elements");
    }
    const uint64_t out_item = format::ItemSize(s.dtype);
    auto* out = static_cast<uint8_t*>(d.data);
    uint64_t dest_elem = 0;
    for (const plan::Extent& e : s.extents) {
      const view::Gather& g = e.gather;
      if (g.zero) {
        ex.zeros_.push_back({out + dest_elem * out_item, g.numel() * out_item});
        ex.bytes_to_zero_ += g.numel() * out_item;
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
      for (uint64_t r = 0; r < g.rows; ++r) {
        uint64_t offset = src.data_offset + (g.start + r * g.row_stride) * in_item;
        uint64_t left = g.row_elems * in_item;
        if (s.conversion != plan::Conversion::kCopy && offset % 4 != 0) {
          return InvalidArgument(src.path + ": float32 data at byte " + std::to_string(offset) + " is not 4-aligned");
        }
        uint8_t* dest = out + dest_elem * out_item;
        while (left > 0) {
          const uint64_t n = std::min(left, max_piece);
          pieces.push_back({source_file[e.source], offset, n, dest, s.conversion});
          ex.bytes_to_copy_ += n;
          dest += OutputBytes(n, s.conversion);
          offset += n;
          left -= n;
        }
        dest_elem += g.row_elems;
      }
    }
  }

  // Sequential reads: sorted pieces, merged while they fit one chunk and leave small gaps.
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  });
  for (const Piece& p : pieces) {
    const uint64_t p_end = p.offset + p.length;
    bool joined = false;
    if (!ex.chunks_.empty()) {
      Chunk& c = ex.chunks_.back();
      const uint64_t c_end = c.offset + c.length;
      const uint64_t new_end = std::max(c_end, p_end);
      if (c.file == p.file && p.offset <= c_end + options.max_gap_bytes && new_end - c.offset <= options.chunk_bytes) {
        c.length = new_end - c.offset;
        joined = true;
      }
    }
    if (!joined) {
      Chunk c;
      c.file = p.file;
      c.offset = p.offset / kAlign * kAlign;
      c.length = p_end - c.offset;
      c.first_op = ex.ops_.size();
      ex.chunks_.push_back(c);
    }
    Chunk& c = ex.chunks_.back();
    ex.ops_.push_back({p.offset - c.offset, p.length, p.dest, p.conversion});
    ++c.op_count;
  }
  for (const Chunk& c : ex.chunks_) ex.bytes_to_read_ += c.length;
  return ex;
}

Status Executor::ReadChunk(const Chunk& chunk, uint8_t* out) const {
  uint64_t done = 0;
  while (done < chunk.length) {
    const ssize_t n = ::pread(files_[chunk.file].get(), out + done, chunk.length - done,
                              static_cast<off_t>(chunk.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("pread " + paths_[chunk.file] + " at byte " + std::to_string(chunk.offset + done), errno);
    if (n == 0) {
      return IoError(paths_[chunk.file] + ": the file ends before byte " + std::to_string(chunk.offset + chunk.length) +
                     " (truncated after the plan was made?)");
    }
    done += static_cast<uint64_t>(n);
  }
  return Status();
}

Result<ExecutorStats> Executor::Run(CopyBackend& backend) const {
  const auto start = std::chrono::steady_clock::now();
  const size_t lanes = std::max<size_t>(1, std::min<size_t>(options_.lanes, chunks_.size()));
  RS_RETURN_IF_ERROR(backend.Prepare(lanes, options_.chunk_bytes));
  for (const ZeroOp& z : zeros_) RS_RETURN_IF_ERROR(backend.Zero(z.dest, z.nbytes));

  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mu;
  Status first_error;
  auto lane_main = [&](size_t lane) {
    int slot = 0;
    for (size_t i = next++; i < chunks_.size() && !failed; i = next++) {
      const Chunk& c = chunks_[i];
      Status s = backend.WaitSlot(lane, slot);
      if (s.ok()) s = ReadChunk(c, backend.Staging(lane, slot));
      if (s.ok()) s = backend.Scatter(lane, slot, ops_.data() + c.first_op, c.op_count);
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
  const Status finished = backend.Finish();
  if (!first_error.ok()) return first_error;
  RS_RETURN_IF_ERROR(finished);

  ExecutorStats stats;
  stats.chunks = chunks_.size();
  stats.bytes_read = bytes_to_read_;
  stats.bytes_copied = bytes_to_copy_;
  stats.bytes_zeroed = bytes_to_zero_;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace reshard::gpu
