#include "reshard/ucp/universal_checkpoint.h"

#include <fcntl.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <regex>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include "reshard/base/checked_math.h"
#include "reshard/base/parallel_for.h"
#include "reshard/base/unique_fd.h"
#include "reshard/format/pickle_query.h"
#include "reshard/ucp/checkpoint_fields.h"

namespace reshard::ucp {
namespace {

namespace fs = std::filesystem;
using format::DescribeNode;
using format::kNoNode;
using format::NodeId;
using format::PickleTree;
using format::TorchArchive;

constexpr std::string_view kLatestFile = "latest_universal";
constexpr std::string_view kZeroDir = "zero";
constexpr std::string_view kModelStatesSuffix = "_model_states.pt";
// The tag folder `path` names. A folder with zero/ is one even when it also holds a
// latest_universal: ds_to_universal run with a trailing slash writes an empty one inside it.
Result<std::string> ResolveTagDir(const std::string& path) {
  if (IsDir(path + "/" + std::string(kZeroDir))) return path;
  const std::string latest = path + "/" + std::string(kLatestFile);
  if (!IsFile(latest)) {
    if (!IsDir(path)) return NotFound(path + ": no such folder");
    return InvalidArgument(path + ": not a universal checkpoint (no zero/ folder and no latest_universal file)");
  }
  return FollowTagFile(path, kLatestFile);
}

// A model-states file name: "mp_rank_<tp>_model_states.pt" (stage <= 2) or
// "[bf16_]zero_pp_rank_<dp>_mp_rank_<tp>_model_states.pt" (stage 3). Anything else (AutoEP
// layer_* files, stray files) is not one.
std::optional<RankFileName> ParseModelStatesName(std::string_view name) {
  return ParseRankFileName(name, kModelStatesSuffix);
}

Result<std::vector<std::pair<std::string, RankFileName>>> ListModelStatesFiles(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return IoError(dir + ": cannot list: " + ec.message());
  std::vector<std::pair<std::string, RankFileName>> out;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return IoError(dir + ": listing failed: " + ec.message());
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    // Other files (AutoEP layer_*_expert_* files, notes) are not the engine's to read.
    if (const auto ranks = ParseModelStatesName(name)) out.emplace_back(name, *ranks);
  }
  if (out.empty()) {
    return InvalidArgument(dir +
                           ": not a universal checkpoint (no mp_rank_*_model_states.pt or "
                           "zero_pp_rank_*_mp_rank_*_model_states.pt file next to zero/)");
  }
  // The engine of one stage reads one kind of file; both kinds together means two conversions
  // were copied into one folder.
  const bool zero3 = out.front().second.zero3;
  for (const auto& [name, ranks] : out) {
    if (ranks.zero3 != zero3) {
      return Corrupt(dir + ": holds both mp_rank_*_model_states.pt and zero_pp_rank_*_model_states.pt files");
    }
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.second.tp, a.second.dp) < std::make_pair(b.second.tp, b.second.dp);
  });
  return out;
}

// A degree or world size: bounded so that products of them stay far from overflow later.
Result<int32_t> PositiveInt(const PickleTree& tree, NodeId dict, std::string_view key) {
  const NodeId value = format::DictLookup(tree, dict, key);
  const auto v = format::AsInt(tree, value);
  if (!v || *v < 1 || *v >= kMaxRank) {
    return Corrupt("'" + std::string(key) + "' must be an int from 1 to " + std::to_string(kMaxRank - 1) + ", got " +
                   DescribeNode(tree, value));
  }
  return static_cast<int32_t>(*v);
}

}  // namespace

const ParamEntry* UniversalCheckpoint::FindParam(std::string_view name) const {
  const auto it = param_index_.find(std::string(name));
  return it == param_index_.end() ? nullptr : &params_[it->second];
}

// A linear scan: called a few times per TP rank, over one file per (tp, dp) rank.
const ModelStatesFile* UniversalCheckpoint::ModelStatesForTp(int32_t tp_rank) const {
  for (const ModelStatesFile& f : model_states_) {
    if (f.tp_rank == tp_rank && f.dp_rank <= 0) return &f;
  }
  return nullptr;
}

Result<UniversalCheckpoint> UniversalCheckpoint::Open(const std::string& path) {
  UniversalCheckpoint ucp;
  RS_ASSIGN_OR_RETURN(ucp.dir_, ResolveTagDir(StripTrailingSlashes(path)));
  ucp.tag_ = fs::path(ucp.dir_).filename().string();
  const std::string zero_dir = ucp.dir_ + "/" + std::string(kZeroDir);
  if (!IsDir(zero_dir)) {
    return InvalidArgument(ucp.dir_ + ": not a universal checkpoint (no zero/ folder)");
  }
  // The order matters for the messages: the stage decides which model-states files are
  // expected, and the layout must be known before param_shapes can be checked against it.
  RS_RETURN_IF_ERROR(ucp.LoadOptimizerState(zero_dir + "/optimizer_state.pt"));
  RS_RETURN_IF_ERROR(ucp.LoadModelStates());
  RS_RETURN_IF_ERROR(ucp.LoadSourceLayout());
  RS_RETURN_IF_ERROR(ucp.IndexParams(zero_dir));
  RS_RETURN_IF_ERROR(ucp.MatchAffineSplits());
  return ucp;
}

Status UniversalCheckpoint::MatchAffineSplits() {
  // AutoTP writes each pattern as ^re.escape(name)$: those are looked up by name. Anything else
  // is compiled once and matched against every parameter name (Python re and ECMAScript agree
  // on the escapes and anchors such patterns use).
  const std::vector<AffineSplit>& splits = info_.affine_splits;
  for (size_t i = 0; i < splits.size(); ++i) {
    const std::string& pattern = splits[i].pattern;
    std::string literal;
    bool plain = pattern.size() >= 2 && pattern.front() == '^' && pattern.back() == '$';
    for (size_t k = 1; plain && k + 1 < pattern.size(); ++k) {
      char c = pattern[k];
      if (c == '\\' && k + 2 < pattern.size()) {
        c = pattern[++k];
        plain = !std::isalnum(static_cast<unsigned char>(c));
      } else {
        plain = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '/';
      }
      literal.push_back(c);
    }
    if (plain) {
      affine_split_index_.try_emplace(literal, i);
      continue;
    }
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      return Unsupported(dir_ + ": affine_map pattern '" + pattern + "' is not a regular expression reshardfs reads");
    }
    for (const ParamEntry& p : params_) {
      if (std::regex_search(p.name, re)) affine_split_index_.try_emplace(p.name, i);
    }
  }
  return Status::Ok();
}

const AffineSplit* UniversalCheckpoint::FindAffineSplit(std::string_view name) const {
  const auto it = affine_split_index_.find(std::string(name));
  return it == affine_split_index_.end() ? nullptr : &info_.affine_splits[it->second];
}

Status UniversalCheckpoint::LoadOptimizerState(const std::string& optim_path) {
  if (!IsFile(optim_path)) return NotFound(optim_path + ": missing (both universal loaders read it)");
  RS_ASSIGN_OR_RETURN(optimizer_state_, TorchArchive::Open(optim_path));
  const PickleTree& tree = optimizer_state_.tree();
  const NodeId root = tree.root();
  optimizer_state_root_ = root;
  if (format::DictItems(tree, root) == nullptr) {
    return Corrupt(optim_path + ": expected a dict, got " + DescribeNode(tree, root));
  }
  auto stage = ParseZeroStage(tree, format::DictLookup(tree, root, "zero_stage"));
  if (!stage.ok()) return stage.status().Annotate(optim_path);
  zero_stage_recorded_ = stage->has_value();
  zero_stage_ = stage->value_or(1);
  auto groups = ParseParamGroups(tree, format::DictLookup(tree, root, "param_groups"));
  if (!groups.ok()) return groups.status().Annotate(optim_path);
  param_groups_ = std::move(groups).value();
  return Status::Ok();
}

Status UniversalCheckpoint::LoadModelStates() {
  RS_ASSIGN_OR_RETURN(auto files, ListModelStatesFiles(dir_));
  const bool zero3_files = files.front().second.zero3;
  if (zero3_files != (zero_stage_ == 3)) {
    return Corrupt(dir_ + ": zero/optimizer_state.pt says zero_stage " + std::to_string(zero_stage_) +
                   " but the model-states files are " + (zero3_files ? "ZeRO-3 per-rank files (" : "mp_rank files (") +
                   files.front().first + ")");
  }
  // The files are sorted by (tp, dp); walking the expected grid in the same order finds a
  // missing rank, a duplicate (two names for one rank) and a ragged grid alike.
  const int32_t tp_files = files.back().second.tp + 1;
  const int32_t dp_files = zero3_files ? files.back().second.dp + 1 : 1;
  size_t k = 0;
  for (int32_t t = 0; t < tp_files; ++t) {
    for (int32_t d = zero3_files ? 0 : -1; d < (zero3_files ? dp_files : 0); ++d, ++k) {
      if (k >= files.size() || files[k].second.tp != t || files[k].second.dp != d) {
        return Corrupt(dir_ + ": no model-states file for tp rank " + std::to_string(t) +
                       (zero3_files ? ", dp rank " + std::to_string(d) : std::string()) + " (or a duplicate of one)");
      }
    }
  }
  if (k != files.size()) return Corrupt(dir_ + ": the model-states files do not form a complete tp x dp grid");
  for (auto& [name, ranks] : files) {
    RS_ASSIGN_OR_RETURN(auto archive, TorchArchive::Open(dir_ + "/" + name));
    model_states_.push_back(ModelStatesFile{name, ranks.tp, ranks.dp, std::move(archive)});
  }
  tp_degree_ = tp_files;
  dp_world_size_ = dp_files;  // stage 3; stage <= 2 takes it from the file below
  return Status::Ok();
}

Status UniversalCheckpoint::LoadSourceLayout() {
  // DeepSpeed's converter reads the layout and universal_checkpoint_info from the first file.
  const ModelStatesFile& first = model_states_.front();
  const PickleTree& tree = first.archive.tree();
  const NodeId root = tree.root();
  auto annotate = [&](Status s) { return std::move(s).Annotate(first.archive.path()); };
  if (format::DictItems(tree, root) == nullptr) {
    return annotate(Corrupt("expected a dict, got " + DescribeNode(tree, root)));
  }
  const int32_t tp_files = tp_degree_;
  const NodeId dims = format::DictLookup(tree, root, "checkpoint_parallel_dimensions");
  if (dims != kNoNode && !format::IsNone(tree, dims)) {
    auto pp = PositiveInt(tree, dims, "pp_degree");
    auto tp = PositiveInt(tree, dims, "tp_degree");
    if (!pp.ok()) return annotate(pp.status().Annotate("checkpoint_parallel_dimensions"));
    if (!tp.ok()) return annotate(tp.status().Annotate("checkpoint_parallel_dimensions"));
    if (*pp != 1) {
      return annotate(Unsupported("pipeline-parallel source (pp_degree " + std::to_string(*pp) +
                                  "): reshardfs serves TP x DP layouts only"));
    }
    tp_degree_ = *tp;
  }
  if (tp_degree_ != tp_files) {
    return annotate(Corrupt("tp_degree " + std::to_string(tp_degree_) + " but the folder holds " +
                            std::to_string(tp_files) + " TP ranks of model-states files"));
  }
  auto dp = PositiveInt(tree, root, "dp_world_size");
  if (!dp.ok()) return annotate(dp.status());
  if (zero_stage_ == 3 && *dp != dp_world_size_) {
    return annotate(Corrupt("dp_world_size " + std::to_string(*dp) + " but the folder holds " +
                            std::to_string(dp_world_size_) + " DP ranks of ZeRO-3 model-states files"));
  }
  dp_world_size_ = *dp;
  auto info = ParseUniversalCheckpointInfo(tree, format::DictLookup(tree, root, "universal_checkpoint_info"));
  if (!info.ok()) return annotate(info.status());
  info_ = std::move(info).value();
  return Status::Ok();
}

Status UniversalCheckpoint::IndexParams(const std::string& zero_dir) {
  // param_shapes of every TP rank: rank 0 gives the order and groups, every rank its own shapes.
  std::vector<GroupShapes> shapes_by_tp;
  std::vector<std::map<std::string, const std::vector<int64_t>*>> shape_index(static_cast<size_t>(tp_degree_));
  for (int32_t t = 0; t < tp_degree_; ++t) {
    const std::string& file = ModelStatesForTp(t)->archive.path();
    const PickleTree& tree = ModelStatesForTp(t)->archive.tree();
    auto shapes = ParseParamShapes(tree, format::DictLookup(tree, tree.root(), "param_shapes"));
    if (!shapes.ok()) return shapes.status().Annotate(file);
    shapes_by_tp.push_back(std::move(shapes).value());
  }
  for (int32_t t = 0; t < tp_degree_; ++t) {
    auto& index = shape_index[static_cast<size_t>(t)];
    for (const auto& group : shapes_by_tp[static_cast<size_t>(t)]) {
      for (const auto& [name, shape] : group) {
        if (!index.emplace(name, &shape).second) {
          return Corrupt(ModelStatesForTp(t)->archive.path() + ": param_shapes lists '" + name + "' twice");
        }
      }
    }
    if (index.size() != shape_index[0].size()) {
      return Corrupt(ModelStatesForTp(t)->archive.path() + ": param_shapes lists " + std::to_string(index.size()) +
                     " parameters but tp rank 0 lists " + std::to_string(shape_index[0].size()));
    }
  }
  num_source_groups_ = static_cast<int32_t>(shapes_by_tp[0].size());
  RS_RETURN_IF_ERROR(CheckParamGroups());

  // Index and check the folders in parallel (thousands of small files: mostly open/read/parse);
  // ParallelFor returns the error of the lowest failing parameter, the one a sequential walk
  // would meet first.
  struct Listed {
    const std::string* name;
    const std::vector<int64_t>* shape0;
    int32_t group;
  };
  std::vector<Listed> order;
  for (size_t g = 0; g < shapes_by_tp[0].size(); ++g) {
    for (const auto& [name, shape0] : shapes_by_tp[0][g]) order.push_back({&name, &shape0, static_cast<int32_t>(g)});
  }
  std::vector<ParamEntry> entries(order.size());
  auto index_listed = [&](size_t k) -> Status {
    const std::string& name = *order[k].name;
    const std::string dir = zero_dir + "/" + name;
    // One open of the folder: its files are opened relative to it, and a missing folder shows here.
    const UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd.valid()) {
      const int err = errno;
      if (err == ENOENT || err == ENOTDIR) {
        return NotFound(dir + ": missing, but param_shapes of " + model_states_.front().name + " lists '" + name + "'");
      }
      return NotFound(dir + ": cannot list the parameter folder: " + std::strerror(err));
    }
    RS_ASSIGN_OR_RETURN(ParamEntry entry, IndexParamFolder(dir_fd.get(), dir, name));
    entry.listed = true;
    entry.source_group = order[k].group;
    for (int32_t t = 0; t < tp_degree_; ++t) {
      const auto& index = shape_index[static_cast<size_t>(t)];
      const auto it = index.find(name);
      if (it == index.end()) {
        return Corrupt(ModelStatesForTp(t)->archive.path() + ": param_shapes lacks '" + name +
                       "', which tp rank 0 lists");
      }
      entry.tp_shapes.push_back(*it->second);
    }
    RS_RETURN_IF_ERROR(CheckStoredNumel(entry, *order[k].shape0));
    entries[k] = std::move(entry);
    return Status::Ok();
  };
  RS_RETURN_IF_ERROR(ParallelFor(order.size(), index_listed));
  std::set<std::string> listed;
  for (const Listed& l : order) listed.insert(*l.name);
  params_ = std::move(entries);

  // Then the folders param_shapes does not list, by name: their order carries no meaning (the
  // converter writes them from a dict walk) and sorting makes the index reproducible.
  std::error_code ec;
  std::vector<std::string> unlisted;
  fs::directory_iterator it(zero_dir, ec);
  if (ec) return IoError(zero_dir + ": cannot list: " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return IoError(zero_dir + ": listing failed: " + ec.message());
    std::error_code type_ec;
    const std::string name = it->path().filename().string();
    if (it->is_directory(type_ec) && listed.count(name) == 0) unlisted.push_back(name);
  }
  std::sort(unlisted.begin(), unlisted.end());
  std::vector<ParamEntry> unlisted_entries(unlisted.size());
  auto index_unlisted = [&](size_t k) -> Status {
    RS_ASSIGN_OR_RETURN(unlisted_entries[k], IndexParamFolder(zero_dir + "/" + unlisted[k], unlisted[k]));
    return Status::Ok();
  };
  RS_RETURN_IF_ERROR(ParallelFor(unlisted.size(), index_unlisted));
  for (ParamEntry& entry : unlisted_entries) params_.push_back(std::move(entry));
  // Folder names are unique, so every name maps to exactly one entry.
  for (size_t k = 0; k < params_.size(); ++k) param_index_.emplace(params_[k].name, k);
  return Status::Ok();
}

Status UniversalCheckpoint::CheckParamGroups() const {
  const std::string optim_path = optimizer_state_.path();
  // Stage <= 2: one optimizer param group per param_shapes group (the planner takes each
  // group's hyper-parameters from here). Stage 3: the groups name sub-groups, each once.
  if (zero_stage_ <= 2) {
    if (param_groups_.size() != static_cast<size_t>(num_source_groups_)) {
      return Corrupt(optim_path + ": has " + std::to_string(param_groups_.size()) +
                     " param groups but param_shapes has " + std::to_string(num_source_groups_));
    }
    return Status::Ok();
  }
  std::set<int64_t> seen;
  for (const ParamGroup& g : param_groups_) {
    for (int64_t id : g.params) {
      if (id < 0 || id >= num_source_groups_ || !seen.insert(id).second) {
        return Corrupt(optim_path + ": param_groups names sub-group " + std::to_string(id) + ", but there are " +
                       std::to_string(num_source_groups_) + " (or it is named twice)");
      }
    }
  }
  return Status::Ok();
}

Status UniversalCheckpoint::CheckStoredNumel(const ParamEntry& entry, const std::vector<int64_t>& recorded) const {
  // With one source TP rank nothing was cut or merged, so the stored tensor holds exactly the
  // recorded parameter; vocab rows may have been stripped and experts gathered over EP, so
  // those are left to the planner.
  const bool exact = tp_degree_ == 1 && !entry.categories.vocab_tensor.value_or(false) &&
                     !entry.categories.is_expert_param.value_or(false);
  if (!exact) return Status::Ok();
  const auto stored = ShapeNumel(entry.full_shape), expected = ShapeNumel(recorded);
  if (stored && expected && *stored == *expected) return Status::Ok();
  return Corrupt(entry.dir + "/fp32.pt: holds " + (stored ? std::to_string(*stored) : "too many") +
                 " elements but param_shapes records " + (expected ? std::to_string(*expected) : "too many") +
                 " for '" + entry.name + "'");
}

}  // namespace reshard::ucp
