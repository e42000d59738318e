#include "gpu/executor.h"

#include <chrono>

namespace reshard::gpu {

Result<Executor> Executor::Create(const std::vector<plan::Source>& sources, const std::vector<Destination>& dests,
                                  const ExecutorOptions& options) {
  if (options.lanes < 1 || options.chunk_bytes < 2 * kChunkAlign || options.chunk_bytes % kChunkAlign != 0) {
    return InvalidArgument("executor options: lanes must be >= 1 and chunk_bytes a multiple of 64, >= 128");
  }
  Executor ex;
  ex.options_ = options;
  RS_RETURN_IF_ERROR(ex.files_.Add(sources));
  std::vector<const plan::StoragePlan*> storages;
  for (const Destination& d : dests) {
    if (d.storage != nullptr && d.data == nullptr && d.storage->numel > 0) {
      return InvalidArgument("executor: storage '" + d.storage->key + "' has no destination buffer");
    }
    storages.push_back(d.storage);
  }
  std::vector<Piece> pieces;
  std::vector<ZeroPiece> zeros;
  // Pieces leave room for aligning their chunk's start down.
  RS_RETURN_IF_ERROR(AppendPieces(sources, ex.files_, storages, 0, options.chunk_bytes - kChunkAlign, pieces, zeros));
  for (const ZeroPiece& z : zeros) {
    ex.zeros_.push_back({static_cast<uint8_t*>(dests[z.dest].data) + z.dest_offset, z.nbytes});
    ex.bytes_to_zero_ += z.nbytes;
  }
  const std::vector<Chunk> chunks = MergeIntoChunks(pieces, options.chunk_bytes, options.max_gap_bytes);
  ex.ops_.reserve(pieces.size());
  for (const Chunk& c : chunks) {
    for (size_t i = c.first_piece; i < c.first_piece + c.piece_count; ++i) {
      const Piece& p = pieces[i];
      ex.ops_.push_back({p.offset - c.offset, p.length, static_cast<uint8_t*>(dests[p.dest].data) + p.dest_offset,
                         p.conversion});
      ex.bytes_to_copy_ += p.length;
    }
    ex.bytes_to_read_ += c.length;
  }
  for (const Chunk& c : chunks) {
    const CopyOp* ops = ex.ops_.data() + c.first_piece;
    const bool direct = DirectReadable(ops, c.piece_count);
    ex.work_.push_back({c.file, c.offset, c.length, ops, c.piece_count, direct});
    if (direct) ex.bytes_direct_ += c.length;
  }
  return ex;
}

Result<ExecutorStats> Executor::Run(CopyBackend& backend) const {
  const auto start = std::chrono::steady_clock::now();
  const size_t lanes = std::max<size_t>(1, std::min<size_t>(options_.lanes, work_.size()));
  RS_RETURN_IF_ERROR(backend.Prepare(lanes, options_.chunk_bytes));
  for (const ZeroOp& z : zeros_) RS_RETURN_IF_ERROR(backend.Zero(z.dest, z.nbytes));
  const Status ran = RunLanes(files_, work_, lanes, backend);
  const Status finished = backend.Finish();
  RS_RETURN_IF_ERROR(ran);
  RS_RETURN_IF_ERROR(finished);
  ExecutorStats stats;
  stats.chunks = work_.size();
  stats.bytes_read = bytes_to_read_;
  stats.bytes_read_direct = backend.ReadsIntoDestinations() ? bytes_direct_ : 0;
  stats.bytes_copied = bytes_to_copy_;
  stats.bytes_zeroed = bytes_to_zero_;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

}  // namespace reshard::gpu
