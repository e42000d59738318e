// The parts of a read schedule that gpu::Executor (one rank) and gpu::NodeExecutor (the ranks of
// a node reading cooperatively) share: the opened source files, the pieces a set of storage
// plans reads, their merge into sequential chunks, and the lane loop that reads chunks into
// staging and hands their copies to a backend.
//
// Units are bytes unless a name says elements. All of it is built at plan time; RunLanes is the
// only part that does I/O. Thread safety: SourceFileTable::Read may run concurrently.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu/copy_backend.h"
#include "reshard/base/status.h"
#include "reshard/base/unique_fd.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"

namespace reshard::gpu {

// Every distinct file of some sources, opened once (O_RDONLY | O_CLOEXEC) and checked to hold
// them; a computed source (plan::Source::computed) is a file read from its bytes in memory.
// Movable, not copyable.
class SourceFileTable {
 public:
  // Errors: kIoError (open/fstat), kCorrupt (a source running past its file's end).
  Status Add(const std::vector<plan::Source>& sources);
  // The file index of `path`; precondition: a source of Add named it.
  uint32_t FileOf(const std::string& path) const { return index_.at(path); }
  // Reads [offset, offset + length) of file `file`. Errors: kIoError naming the file and offset
  // (pread failed, or the file ends early: truncated after the plan).
  Status Read(uint32_t file, uint64_t offset, uint64_t length, uint8_t* out) const;
  // Reads [offset, offset + length) of file `file` straight into the destinations of `ops` (plain
  // copies, sorted by staging_offset and disjoint: see DirectReadable); the bytes between them go
  // to `scratch` (at least `length` bytes, contents discarded). `iov` is the caller's reusable
  // vector. Errors: as Read.
  Status ReadInto(uint32_t file, uint64_t offset, uint64_t length, const CopyOp* ops, size_t count, uint8_t* scratch,
                  std::vector<struct iovec>& iov) const;
  // The path of file `file` (< the number of files added), and whether it is computed (in memory).
  const std::string& path(uint32_t file) const { return paths_[file]; }
  bool computed(uint32_t file) const { return computed_[file] != nullptr; }

 private:
  // The in-memory bytes [offset, offset + length) of computed file `file`, or kOutOfRange.
  Result<const uint8_t*> ComputedBytes(uint32_t file, uint64_t offset, uint64_t length) const;
  // preadv of `length` bytes at `offset` into iov[0, count), which it advances as bytes land.
  Status PreadAll(uint32_t file, uint64_t offset, uint64_t length, struct iovec* iov, size_t count) const;

  std::vector<UniqueFd> files_;
  std::vector<std::string> paths_;
  std::vector<uint64_t> sizes_;
  std::vector<std::shared_ptr<const std::string>> computed_;  // per file: its bytes when computed (not opened)
  std::map<std::string, uint32_t> index_;
};

// One contiguous run of source bytes and where it goes: destination `dest` (an index into the
// storage list of rank `rank`) at byte `dest_offset`, converted as `conversion` says.
struct Piece {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t rank = 0;
  uint32_t dest = 0;
  uint64_t dest_offset = 0;
  plan::Conversion conversion = plan::Conversion::kCopy;
};

struct ZeroPiece {
  uint32_t dest = 0;
  uint64_t dest_offset = 0;
  uint64_t nbytes = 0;
};

// Appends the pieces (split at `max_piece` bytes) and zero fills of `storages` (destination i is
// storages[i]) of rank `rank`, whose extents index `sources` (all added to `files`). Errors
// (kInvalidArgument): a null storage, extents not covering a storage, an extent naming a missing
// source, reading past its source, or with a dtype its conversion cannot take, and float32 data
// to convert that is not 4-byte aligned.
Status AppendPieces(const std::vector<plan::Source>& sources, const SourceFileTable& files,
                    const std::vector<const plan::StoragePlan*>& storages, uint32_t rank, uint64_t max_piece,
                    std::vector<Piece>& pieces, std::vector<ZeroPiece>& zeros);

// A sequential read: staging byte 0 is file byte `offset`; pieces [first_piece, first_piece +
// piece_count) of the sorted piece list lie inside it.
struct Chunk {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  size_t first_piece = 0;
  size_t piece_count = 0;
};

inline constexpr uint64_t kChunkAlign = 64;  // chunk starts; staging buffers are aligned the same way

// Sorts `pieces` by (file, offset) and merges them into chunks of at most `chunk_bytes` (a
// multiple of kChunkAlign) whose pieces lie within `max_gap_bytes` of each other.
std::vector<Chunk> MergeIntoChunks(std::vector<Piece>& pieces, uint64_t chunk_bytes, uint64_t max_gap_bytes);

// One chunk's read and copies, for RunLanes.
struct ChunkWork {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  const CopyOp* ops = nullptr;
  size_t op_count = 0;
  bool direct = false;  // DirectReadable(ops, op_count): read into the destinations when the backend can
};

// Whether a chunk's copies can be read straight into their destinations: all plain copies, in
// staging order and disjoint (no byte feeds two destinations), and few enough pieces (with the
// gaps between them) for one preadv.
bool DirectReadable(const CopyOp* ops, size_t count);

// Reads the chunks on min(lanes, work.size()) threads, each double-buffered through
// backend.Staging/WaitSlot/Scatter (backend.Prepare must have been called with at least that many
// lanes and staging of every chunk's length); a direct chunk goes straight into its destinations
// when backend.ReadsIntoDestinations(). Returns the first error; does not call Finish.
Status RunLanes(const SourceFileTable& files, const std::vector<ChunkWork>& work, size_t lanes, CopyBackend& backend);

}  // namespace reshard::gpu
