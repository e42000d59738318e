// CompressedBytes: an immutable byte string held in memory as independently compressed chunks,
// any range of which can be read back.
//
// A mount keeps the bytes it computed (zip records, pickles, safetensors headers) for as long as
// it serves, and a checkpoint of 100,000 small parameters makes tens of MB of them. They are
// names and headers that repeat with small changes, so zstd shrinks them 10-35x; served files read
// them once or twice, at a few MB per file, so decompressing on read costs little.
//
//   bytes  | chunk 0 (chunk_bytes) | chunk 1 | ... | last chunk (may be shorter) |
//   held   | zstd frame, or the chunk as is when zstd does not shrink it by 1/8 |
//
// Read() decompresses the chunks a range touches. A whole chunk goes straight into the
// caller's buffer; a part of one goes through a per-thread buffer that keeps the last chunk it
// decompressed, so a reader walking a file in small steps decompresses each chunk once. That
// buffer and the thread's decompression context are allocated on a thread's first Read() of a
// compressed chunk, never per call.
//
// Thread safety: immutable after Create(); Read() may run concurrently from any number of
// threads. Movable and copyable (a copy holds the same bytes). Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reshard/base/status.h"

namespace reshard {

class CompressedBytes {
 public:
  // The largest chunk, and the default: big enough for zstd to find the repeats of a pickle or
  // a zip directory, small enough that decompressing one for a short read stays cheap (tens of
  // microseconds).
  static constexpr size_t kMaxChunkBytes = size_t{64} << 10;

  // Compresses `bytes` in chunks of `chunk_bytes` (1 to kMaxChunkBytes; InvalidArgument
  // otherwise). kInternal if zstd fails (out of memory).
  static Result<CompressedBytes> Create(std::string_view bytes, size_t chunk_bytes = kMaxChunkBytes);

  // Empty: size() 0.
  CompressedBytes() = default;
  CompressedBytes(const CompressedBytes&) = default;
  CompressedBytes& operator=(const CompressedBytes&) = default;
  // Leave `other` empty.
  CompressedBytes(CompressedBytes&& other) noexcept { *this = std::move(other); }
  CompressedBytes& operator=(CompressedBytes&& other) noexcept;

  // Bytes held before compression.
  uint64_t size() const { return size_; }
  // Bytes of memory the chunks take, compressed or not.
  uint64_t stored_bytes() const { return stored_.size(); }

  // Copies bytes [offset, offset + length) to `out` (which must hold `length` bytes).
  // OutOfRange when the range is not inside [0, size()); kCorrupt when a chunk does not
  // decompress to its length (the held bytes were damaged in memory).
  Status Read(uint64_t offset, void* out, size_t length) const;

  // All the bytes, for tests and tools.
  Result<std::string> ToString() const;

 private:
  // Chunk `chunk` decompressed into `out` (chunk_length(chunk) bytes).
  Status DecompressChunk(uint64_t chunk, uint8_t* out) const;
  // Where chunk `chunk` starts in stored_, and its length before compression.
  uint64_t chunk_begin(uint64_t chunk) const;
  uint64_t chunk_length(uint64_t chunk) const;

  uint64_t id_ = 0;  // tells this byte string's chunks apart in the per-thread buffer; 0: empty
  uint64_t size_ = 0;
  uint32_t chunk_bytes_ = kMaxChunkBytes;
  std::string stored_;              // the chunks, back to back
  std::vector<uint64_t> ends_;      // where each chunk ends in stored_
};

}  // namespace reshard
