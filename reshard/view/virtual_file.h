// VirtualFile: the sorted segment table that every served file is.
//
// A file reshardfs serves (a torch.save zip, a safetensors file) is planned once, at mount, as a
// list of segments that tile [0, size()) without gaps or overlaps:
//
//   offset 0                                                                      size()
//   | kInline: blob 2 [0, 96) | kData: record 0 [0, 4096) | kZero | kInline: blob 2 [96, 180) |
//
// - kInline: bytes precomputed at layout time (headers, pickles, central directories), copied
//   from one of the file's blobs at `source_offset`. Blobs are held compressed
//   (base/compressed_bytes.h): the 10,002-parameter checkpoint of scripts/bench_scale.sh
//   computes 8.0 MB of them, held in 0.68 MB (valgrind massif of the mounted daemon).
// - kData: bytes computed on read (tensor data). `index` is a record id chosen by the builder
//   (the zip writer uses the entry index, the safetensors writer the input tensor index) and
//   `source_offset` is the offset inside that record. A DataFill supplies them.
// - kZero: zero bytes; `index` and `source_offset` are ignored.
//
// Read() binary-searches the segment holding the first byte, then walks forward. It neither
// allocates (but for a thread's first read of a compressed blob) nor parses: everything was
// decided when the table was built ("plan once, read many").
//
// Ownership and threads: a VirtualFile owns its segments and blobs and is immutable after
// Create(), so Read() may run concurrently from any number of threads (it is const and keeps no
// mutable state). Whether the DataFill is thread-safe is the caller's business. Movable and
// copyable. Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "reshard/base/compressed_bytes.h"
#include "reshard/base/status.h"

namespace reshard::view {

struct Segment {
  enum class Kind : uint8_t { kInline, kData, kZero };

  uint64_t offset = 0;         // first byte of the segment in the virtual file
  uint64_t length = 0;         // bytes; never 0 in a valid table
  Kind kind = Kind::kZero;
  uint32_t index = 0;          // kInline: blob index; kData: data record id; kZero: ignored
  uint64_t source_offset = 0;  // kInline: offset in the blob; kData: offset in the record
};

// DataFill: a non-owning reference to a callable
//   Status fill(uint32_t record, uint64_t offset, uint8_t* out, size_t length)
// that writes `length` bytes of data record `record`, starting at byte `offset` of the record,
// to `out`. VirtualFile only asks for ranges inside one kData segment, i.e. inside
// [source_offset, source_offset + length) of a segment naming `record`; builders that keep
// segments inside their records therefore never see out-of-record requests. A non-OK Status
// aborts the Read() and is returned from it unchanged.
//
// Like a function_ref, a DataFill stores a pointer to the callable and a trampoline, so building
// one never allocates (std::function could). The referenced callable must outlive the DataFill:
// passing a lambda directly to Read() or WriteAll() is fine (the temporary lives until the call
// returns); storing a DataFill built from a temporary is not.
class DataFill {
 public:
  using FunctionPointer = Status (*)(uint32_t, uint64_t, uint8_t*, size_t);

  // From any callable object (lambda, functor); refers to it, does not copy it.
  template <typename F,
            typename = std::enable_if_t<
                !std::is_same_v<std::decay_t<F>, DataFill> &&
                !std::is_function_v<std::remove_reference_t<F>> &&
                std::is_invocable_r_v<Status, F&, uint32_t, uint64_t, uint8_t*, size_t>>>
  DataFill(F&& fill) noexcept  // NOLINT: implicit, so lambdas can be passed directly
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(fill)))),
        invoke_(&InvokeObject<std::remove_reference_t<F>>) {}

  // From a plain function (stored by value: a function outlives everything).
  DataFill(FunctionPointer function) noexcept  // NOLINT: implicit, like the above
      : function_(function), invoke_(&InvokeFunction) {}

  Status operator()(uint32_t record, uint64_t offset, uint8_t* out, size_t length) const {
    return invoke_(*this, record, offset, out, length);
  }

 private:
  template <typename F>
  static Status InvokeObject(const DataFill& self, uint32_t record, uint64_t offset,
                             uint8_t* out, size_t length) {
    return (*static_cast<F*>(self.object_))(record, offset, out, length);
  }
  static Status InvokeFunction(const DataFill& self, uint32_t record, uint64_t offset,
                               uint8_t* out, size_t length) {
    return self.function_(record, offset, out, length);
  }

  void* object_ = nullptr;
  FunctionPointer function_ = nullptr;
  Status (*invoke_)(const DataFill&, uint32_t, uint64_t, uint8_t*, size_t);
};

class VirtualFile {
 public:
  // Validates and adopts a segment table. Errors (kInvalidArgument, naming the segment index and
  // the values): a segment of length 0; the first segment not at offset 0; a segment not
  // starting where the previous one ended (gap, overlap or unsorted); an end offset past
  // UINT64_MAX; an unknown kind; a kInline segment naming a missing blob or reaching past its
  // blob's end; a kData segment whose source range overflows. An empty table is a valid empty
  // file. Blobs not referenced by any segment are allowed. The table is shrunk to fit and the
  // blobs compressed (kInternal if zstd fails).
  static Result<VirtualFile> Create(std::vector<Segment> segments, std::vector<std::string> blobs);

  // An empty file (size 0, no segments).
  VirtualFile() = default;

  // Total size in bytes: the end of the last segment.
  uint64_t size() const { return size_; }

  // Copies min(length, size() - offset) bytes starting at `offset` into `out` and returns that
  // count; returns 0 when offset >= size() or length == 0 (`out` may then be null). `out` must
  // hold `length` bytes. kData bytes come from `fill`; its first error is returned as is, and
  // `out` then holds an unspecified prefix. Thread-safe; O(log segments) plus the segments
  // touched; allocates only on a thread's first read of a compressed blob.
  Result<size_t> Read(uint64_t offset, uint8_t* out, size_t length, const DataFill& fill) const;

  // The validated table, sorted by offset, and the blobs its kInline segments index.
  const std::vector<Segment>& segments() const { return segments_; }
  const std::vector<CompressedBytes>& blobs() const { return blobs_; }

 private:
  VirtualFile(std::vector<Segment> segments, std::vector<CompressedBytes> blobs, uint64_t size)
      : segments_(std::move(segments)), blobs_(std::move(blobs)), size_(size) {}

  std::vector<Segment> segments_;
  std::vector<CompressedBytes> blobs_;
  uint64_t size_ = 0;
};

// Writes the whole file to `fd` at its current position, in chunks of kWriteAllChunkBytes
// through one buffer allocated per call. For tests and tools, not the FUSE read path. Errors:
// the first fill error, or kIoError naming errno when write(2) fails (EINTR is retried).
inline constexpr size_t kWriteAllChunkBytes = size_t{1} << 20;
Status WriteAll(const VirtualFile& file, const DataFill& fill, int fd);

// Materializes the whole file into a string. For tests and tools; kResourceExhausted when
// size() does not fit a std::string, else the first fill error.
Result<std::string> ReadAll(const VirtualFile& file, const DataFill& fill);

}  // namespace reshard::view
