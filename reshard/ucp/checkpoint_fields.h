// What both source readers (the universal reader in universal_checkpoint.cc and the native reader
// in reshard/native/) parse alike: the ZeRO stage, optimizer param groups and `param_shapes` of
// DeepSpeed's files (kCorrupt naming the field; callers prefix the file), the tag files (`latest`,
// `latest_universal`) and the rank numbers in file names. Thread safety: pure functions (the
// file ones read the file system). Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::ucp {

// More ranks than any run has; bounds the numbers parsed from file names and files.
inline constexpr int32_t kMaxRank = 1 << 20;

bool IsDir(const std::string& path);   // a folder (following links); false on any error
bool IsFile(const std::string& path);  // a regular file (following links); false on any error
std::string StripTrailingSlashes(std::string path);

// A rank as DeepSpeed writes it in a file name (%d / %02d): decimal digits only, below kMaxRank.
std::optional<int32_t> ParseRank(std::string_view digits);

// The ranks in a per-rank file name: "mp_rank_<tp><suffix>" or
// "[bf16_]zero_pp_rank_<dp>_mp_rank_<tp><suffix>" (zero3 true: the stage-3 model-states and every
// optimizer-states name). std::nullopt for any other name (layer_* files, stray files).
struct RankFileName {
  bool zero3 = false;
  int32_t tp = 0;
  int32_t dp = -1;  // zero_pp_rank names only
};
std::optional<RankFileName> ParseRankFileName(std::string_view name, std::string_view suffix);

// The folder the tag file `parent`/`name` (`latest`, `latest_universal`) names, read as DeepSpeed
// reads it (`fd.read().strip()`, joined to `parent`). Errors: kIoError (unreadable), kCorrupt
// (longer than 4096 bytes), kNotFound (empty, or naming no folder), each naming the file.
Result<std::string> FollowTagFile(const std::string& parent, std::string_view name);

// The product of a shape of non-negative dims, or std::nullopt when it overflows 64 bits.
std::optional<uint64_t> ShapeNumel(const std::vector<int64_t>& shape);

// Python's str.strip(): the whitespace DeepSpeed's `fd.read().strip()` removes from `latest`.
std::string StripWhitespace(const std::string& s);

// `zero_stage`: a plain int, or deepspeed.runtime.zero.config.ZeroStageEnum by value or by name;
// std::nullopt when `value` is kNoNode (absent).
Result<std::optional<int32_t>> ParseZeroStage(const format::PickleTree& tree, format::NodeId value);

// `param_groups`: a list of dicts, each with a `params` list of int.
Result<std::vector<ParamGroup>> ParseParamGroups(const format::PickleTree& tree, format::NodeId value);

// One rank's `param_shapes`: per group (a dict), (name, shape) in order; shapes are torch.Size or
// tuples/lists of non-negative ints.
using GroupShapes = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;
Result<GroupShapes> ParseParamShapes(const format::PickleTree& tree, format::NodeId value);
// The shape one group of GroupShapes records for `name`, or nullptr (a linear search: groups are
// walked in order when a checkpoint is opened, not per read). The pointer lives as long as `group`.
const std::vector<int64_t>* FindShape(const GroupShapes::value_type& group, const std::string& name);

}  // namespace reshard::ucp
