#include "gpu/node_executor.h"

#include <algorithm>
#include <string>

namespace reshard::gpu {

Result<NodeExecutor> NodeExecutor::Create(const std::vector<RankStorages>& ranks, uint32_t me,
                                          std::vector<void*> buffers, const NodeOptions& options) {
  const ExecutorOptions& eo = options.executor;
  if (eo.lanes < 1 || eo.chunk_bytes < 2 * kChunkAlign || eo.chunk_bytes % kChunkAlign != 0) {
    return InvalidArgument("executor options: lanes must be >= 1 and chunk_bytes a multiple of 64, >= 128");
  }
  if (me >= ranks.size()) {
    return InvalidArgument("node rank " + std::to_string(me) + " outside a node of " + std::to_string(ranks.size()));
  }
  if (buffers.size() != ranks[me].storages.size()) {
    return InvalidArgument("node rank " + std::to_string(me) + " has " + std::to_string(ranks[me].storages.size()) +
                           " storages but " + std::to_string(buffers.size()) + " buffers");
  }
  for (size_t i = 0; i < buffers.size(); ++i) {
    const plan::StoragePlan* s = ranks[me].storages[i];
    if (s != nullptr && buffers[i] == nullptr && s->numel > 0) {
      return InvalidArgument("executor: storage '" + s->key + "' has no destination buffer");
    }
  }
  NodeExecutor ex;
  ex.options_ = options;
  ex.buffers_ = std::move(buffers);
  const uint32_t n = static_cast<uint32_t>(ranks.size());
  std::vector<Piece> pieces;
  std::vector<ZeroPiece> others_zeros;
  for (uint32_t r = 0; r < n; ++r) {
    if (ranks[r].sources == nullptr) return InvalidArgument("node rank " + std::to_string(r) + " has no sources");
    RS_RETURN_IF_ERROR(ex.files_.Add(*ranks[r].sources));
    RS_RETURN_IF_ERROR(AppendPieces(*ranks[r].sources, ex.files_, ranks[r].storages, r, eo.chunk_bytes - kChunkAlign,
                                    pieces, r == me ? ex.zeros_ : others_zeros));
  }
  const std::vector<Chunk> chunks = MergeIntoChunks(pieces, eo.chunk_bytes, eo.max_gap_bytes);
  for (const Piece& p : pieces) ex.bytes_owned_ += p.rank == me ? p.length : 0;

  // Readers: the least-loaded rank so far, in chunk order (every rank computes the same).
  std::vector<uint32_t> reader(chunks.size());
  std::vector<uint64_t> load(n, 0);
  for (size_t c = 0; c < chunks.size(); ++c) {
    reader[c] = static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[reader[c]] += chunks[c].length;
  }

  // Rounds of about round_bytes, each with its own exchange.
  size_t begin = 0;
  while (begin < chunks.size()) {
    size_t end = begin;
    uint64_t bytes = 0;
    while (end < chunks.size() && (end == begin || bytes + chunks[end].length <= options.round_bytes)) {
      bytes += chunks[end++].length;
    }
    Round round;
    round.send_sizes.assign(n, 0);
    round.recv_sizes.assign(n, 0);
    for (size_t c = begin; c < end; ++c) {
      for (size_t i = chunks[c].first_piece; i < chunks[c].first_piece + chunks[c].piece_count; ++i) {
        if (reader[c] == me && pieces[i].rank != me) round.send_sizes[pieces[i].rank] += pieces[i].length;
        if (reader[c] != me && pieces[i].rank == me) round.recv_sizes[reader[c]] += pieces[i].length;
      }
    }
    // Each owner's (sender's) segment starts after the lower ranks' ones.
    std::vector<uint64_t> send_at(n, 0), recv_at(n, 0);
    for (uint32_t q = 1; q < n; ++q) {
      send_at[q] = send_at[q - 1] + round.send_sizes[q - 1];
      recv_at[q] = recv_at[q - 1] + round.recv_sizes[q - 1];
    }
    for (size_t c = begin; c < end; ++c) {
      const Chunk& chunk = chunks[c];
      if (reader[c] == me) {
        round.chunks.push_back({chunk.file, chunk.offset, chunk.length, round.read_ops.size(), 0});
        ex.bytes_to_read_ += chunk.length;
      }
      for (size_t i = chunk.first_piece; i < chunk.first_piece + chunk.piece_count; ++i) {
        const Piece& p = pieces[i];
        if (reader[c] == me && p.rank == me) {
          round.read_ops.push_back({p.offset - chunk.offset, p.length, false, p.dest, p.dest_offset, p.conversion});
        } else if (reader[c] == me) {
          round.read_ops.push_back({p.offset - chunk.offset, p.length, true, 0, send_at[p.rank], plan::Conversion::kCopy});
          send_at[p.rank] += p.length;
        } else if (p.rank == me) {
          round.unpack_ops.push_back({recv_at[reader[c]], p.length, false, p.dest, p.dest_offset, p.conversion});
          recv_at[reader[c]] += p.length;
        }
      }
      if (reader[c] == me) round.chunks.back().op_count = round.read_ops.size() - round.chunks.back().first_op;
    }
    ex.rounds_.push_back(std::move(round));
    begin = end;
  }
  return ex;
}

std::vector<CopyOp> NodeExecutor::Resolve(const std::vector<OpTemplate>& ops, size_t first, size_t count,
                                          uint8_t* send) const {
  std::vector<CopyOp> out;
  out.reserve(count);
  for (size_t i = first; i < first + count; ++i) {
    const OpTemplate& t = ops[i];
    uint8_t* base = t.to_send ? send : static_cast<uint8_t*>(buffers_[t.dest]);
    out.push_back({t.from, t.length, base + t.dest_offset, t.conversion});
  }
  return out;
}

Status NodeExecutor::ZeroFill(CopyBackend& backend) const {
  for (const ZeroPiece& z : zeros_) {
    RS_RETURN_IF_ERROR(backend.Zero(static_cast<uint8_t*>(buffers_[z.dest]) + z.dest_offset, z.nbytes));
  }
  return backend.Finish();
}

Status NodeExecutor::ReadRound(size_t k, uint8_t* send, CopyBackend& backend) const {
  if (k >= rounds_.size()) return InvalidArgument("no round " + std::to_string(k));
  const Round& round = rounds_[k];
  const std::vector<CopyOp> ops = Resolve(round.read_ops, 0, round.read_ops.size(), send);
  std::vector<ChunkWork> work;
  work.reserve(round.chunks.size());
  for (const ChunkTemplate& c : round.chunks) work.push_back({c.file, c.offset, c.length, ops.data() + c.first_op, c.op_count});
  const size_t lanes = std::max<size_t>(1, std::min<size_t>(options_.executor.lanes, work.size()));
  RS_RETURN_IF_ERROR(backend.Prepare(lanes, options_.executor.chunk_bytes));
  const Status ran = RunLanes(files_, work, lanes, backend);
  const Status finished = backend.Finish();
  RS_RETURN_IF_ERROR(ran);
  return finished;
}

Status NodeExecutor::UnpackRound(size_t k, const uint8_t* recv, CopyBackend& backend) const {
  if (k >= rounds_.size()) return InvalidArgument("no round " + std::to_string(k));
  const Round& round = rounds_[k];
  const std::vector<CopyOp> ops = Resolve(round.unpack_ops, 0, round.unpack_ops.size(), nullptr);
  return backend.ScatterFrom(recv, ops.data(), ops.size());
}

}  // namespace reshard::gpu
