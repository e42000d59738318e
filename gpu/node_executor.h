// NodeExecutor: the ranks of one node fill their buffers cooperatively, reading each source byte
// once per node and exchanging the pieces with their owners.
//
// Every rank of the node builds the same NodeExecutor from every node rank's storage plans (the
// planner is deterministic, so all agree without talking): all ranks' pieces are sorted and merged
// into chunks (read_schedule.h), each chunk is given to the rank with the fewest bytes to read so
// far (ties to the lower rank), and the chunk list is cut into rounds of about `round_bytes` read
// by the whole node, which bounds the exchange buffers. Then, per round k, each rank:
//   1. ReadRound(k, send): reads its chunks; its own pieces go straight into its buffers, the raw
//      source bytes of every other rank's pieces into `send`, packed by owner in rank order
//      (send_sizes(k)[q] bytes for rank q), each owner's pieces in schedule order;
//   2. exchanges: send -> recv with an all-to-all of those sizes (the caller's collective: gloo on
//      CPU, NCCL on GPUs through torch.distributed), recv_sizes(k)[q] bytes from rank q;
//   3. UnpackRound(k, recv): copies (and for lp weights converts) the received pieces into its
//      buffers.
// ZeroFill writes the rank's padding once. Bytes a rank needs from its own reads never travel.
//
// Ownership and threads: owns its files; buffers are borrowed (they must hold each storage's
// nbytes and outlive the calls); the calls are const and run on the caller's thread (ReadRound
// starts `lanes` reader threads of its own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/copy_backend.h"
#include "gpu/executor.h"
#include "gpu/read_schedule.h"
#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"

namespace reshard::gpu {

// One node rank's plan: its sources and its storages (extents index those sources).
struct RankStorages {
  const std::vector<plan::Source>* sources = nullptr;
  std::vector<const plan::StoragePlan*> storages;
};

struct NodeOptions {
  ExecutorOptions executor;
  uint64_t round_bytes = uint64_t{256} << 20;  // source bytes the node reads per round (>= 1 chunk)
};

class NodeExecutor {
 public:
  // `ranks[r]` is node rank r's plan; `me` this process's node rank; `buffers[i]` its buffer for
  // ranks[me].storages[i]. Errors: those of Executor::Create, and kInvalidArgument for `me`
  // outside the node or a buffer count that does not match.
  static Result<NodeExecutor> Create(const std::vector<RankStorages>& ranks, uint32_t me, std::vector<void*> buffers,
                                     const NodeOptions& options = {});

  size_t rounds() const { return rounds_.size(); }
  // Bytes this rank sends to / receives from each node rank in round `k` (0 to and from itself).
  const std::vector<uint64_t>& send_sizes(size_t k) const { return rounds_[k].send_sizes; }
  const std::vector<uint64_t>& recv_sizes(size_t k) const { return rounds_[k].recv_sizes; }
  // Source bytes this rank reads in all rounds, and bytes of pieces it owns (what it would read alone).
  uint64_t bytes_to_read() const { return bytes_to_read_; }
  uint64_t bytes_owned() const { return bytes_owned_; }

  Status ZeroFill(CopyBackend& backend) const;
  // `send` holds the sum of send_sizes(k) bytes, addressable by the backend.
  Status ReadRound(size_t k, uint8_t* send, CopyBackend& backend) const;
  // `recv` holds the sum of recv_sizes(k) bytes as the exchange delivered them.
  Status UnpackRound(size_t k, const uint8_t* recv, CopyBackend& backend) const;

 private:
  // A copy whose destination is resolved per call: this rank's buffer (`to_send` false, `dest`
  // a buffer index) or the send buffer (`to_send` true, `dest_offset` into it).
  struct OpTemplate {
    uint64_t from = 0;  // staging offset (ReadRound) or recv offset (UnpackRound)
    uint64_t length = 0;
    bool to_send = false;
    uint32_t dest = 0;
    uint64_t dest_offset = 0;
    plan::Conversion conversion = plan::Conversion::kCopy;
  };
  struct ChunkTemplate {
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    size_t first_op = 0;
    size_t op_count = 0;
  };
  struct Round {
    std::vector<ChunkTemplate> chunks;  // the ones this rank reads
    std::vector<OpTemplate> read_ops;
    std::vector<OpTemplate> unpack_ops;
    std::vector<uint64_t> send_sizes, recv_sizes;
  };

  NodeExecutor() = default;
  std::vector<CopyOp> Resolve(const std::vector<OpTemplate>& ops, size_t first, size_t count, uint8_t* send) const;

  NodeOptions options_;
  SourceFileTable files_;
  std::vector<void*> buffers_;
  std::vector<ZeroPiece> zeros_;
  std::vector<Round> rounds_;
  uint64_t bytes_to_read_ = 0;
  uint64_t bytes_owned_ = 0;
};

}  // namespace reshard::gpu
