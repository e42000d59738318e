#include "reshard/native/native_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "reshard/base/checked_math.h"
#include "reshard/base/parallel_for.h"
#include "reshard/format/pickle_query.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/ucp/checkpoint_fields.h"
#include "reshard/ucp/param_state.h"

namespace reshard::native {

namespace fs = std::filesystem;
using format::DescribeNode;
using format::kNoNode;
using format::NodeId;
using format::PickleTree;
using format::TorchArchive;
using ucp::ParamEntry;
using ucp::StateTensor;
using ucp::TensorPiece;

namespace {

constexpr std::string_view kOptimSuffix = "_optim_states.pt";
constexpr int32_t kMaxRank = 1 << 20;
constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};

bool IsDir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

bool IsFile(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

std::string StripTrailingSlashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::optional<int32_t> ParseRank(std::string_view digits) {
  if (digits.empty() || digits.size() > 7) return std::nullopt;
  int32_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v < kMaxRank ? std::optional<int32_t>(v) : std::nullopt;
}

// "[bf16_]zero_pp_rank_<dp>_mp_rank_<tp>_optim_states.pt" -> (tp, dp).
std::optional<std::pair<int32_t, int32_t>> ParseOptimName(std::string_view name) {
  if (name.size() <= kOptimSuffix.size() || name.substr(name.size() - kOptimSuffix.size()) != kOptimSuffix) {
    return std::nullopt;
  }
  name.remove_suffix(kOptimSuffix.size());
  constexpr std::string_view kBf16 = "bf16_", kZero = "zero_pp_rank_", kMp = "mp_rank_";
  if (name.substr(0, kBf16.size()) == kBf16) name.remove_prefix(kBf16.size());
  if (name.substr(0, kZero.size()) != kZero) return std::nullopt;
  name.remove_prefix(kZero.size());
  const size_t sep = name.find('_');
  if (sep == std::string_view::npos) return std::nullopt;
  const auto dp = ParseRank(name.substr(0, sep));
  name.remove_prefix(sep + 1);
  if (!dp || name.substr(0, kMp.size()) != kMp) return std::nullopt;
  name.remove_prefix(kMp.size());
  const auto tp = ParseRank(name);
  if (!tp) return std::nullopt;
  return std::make_pair(*tp, *dp);
}

bool HasOptimFiles(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > kOptimSuffix.size() && name.compare(name.size() - kOptimSuffix.size(), kOptimSuffix.size(),
                                                          kOptimSuffix) == 0) {
      return true;
    }
  }
  return false;
}

// The tag folder of a native checkpoint: `path` itself when it holds optimizer files, else the
// folder its `latest` names (read as DeepSpeed reads it: whitespace-stripped).
Result<std::string> ResolveTagDir(const std::string& path) {
  if (HasOptimFiles(path)) return path;
  const std::string latest = path + "/latest";
  if (!IsFile(latest)) {
    if (!IsDir(path)) return NotFound(path + ": no such folder");
    return InvalidArgument(path + ": not a DeepSpeed checkpoint (no *_optim_states.pt files and no latest file)");
  }
  std::ifstream in(latest, std::ios::binary);
  constexpr size_t kMaxTagBytes = 4096;
  std::string content(kMaxTagBytes + 1, '\0');
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (in.bad()) return IoError(latest + ": read failed");
  content.resize(static_cast<size_t>(in.gcount()));
  if (content.size() > kMaxTagBytes) return Corrupt(latest + ": longer than " + std::to_string(kMaxTagBytes) + " bytes");
  const std::string tag = ucp::StripWhitespace(content);
  if (tag.empty()) return NotFound(latest + ": empty, names no checkpoint folder");
  const std::string dir = StripTrailingSlashes(path + "/" + tag);
  if (!IsDir(dir)) return NotFound(latest + ": names '" + tag + "', but " + dir + " is not a folder");
  if (!HasOptimFiles(dir)) {
    return Unsupported(dir + ": no *_optim_states.pt files: a ZeRO stage-0 checkpoint (its optimizer state lives in "
                       "the model-states file), which reshardfs does not serve");
  }
  return dir;
}

// The value of int key `key` in dict `dict` (torch optimizer state is keyed by int).
NodeId IntKeyLookup(const PickleTree& tree, NodeId dict, int64_t key) {
  const std::vector<NodeId>* items = format::DictItems(tree, dict);
  if (items == nullptr) return kNoNode;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    if (format::AsInt(tree, (*items)[i]) == key) return (*items)[i + 1];
  }
  return kNoNode;
}

std::optional<uint64_t> Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    const auto m = CheckedMul(n, static_cast<uint64_t>(d));
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

// A 1-D flat tensor of an optimizer file, located in the file.
Result<StateTensor> FlatTensor(const TorchArchive& archive, NodeId node, const std::string& what) {
  RS_ASSIGN_OR_RETURN(std::optional<format::TensorRef> ref, format::MatchTensorWithAttributes(archive.tree(), node));
  if (!ref) return Corrupt(archive.path() + ": " + what + " is " + DescribeNode(archive.tree(), node) + ", not a tensor");
  if (ref->shape.size() != 1) {
    return Corrupt(archive.path() + ": " + what + " is a " + std::to_string(ref->shape.size()) + "-d tensor, not a flat one");
  }
  auto located = ucp::LocateTensor(archive, *ref);
  if (!located.ok()) return std::move(located.status()).Annotate(archive.path() + ": " + what);
  return std::move(located).value();
}

// A parameter's state being assembled from the ranks' fragments.
struct PendingState {
  std::vector<TensorPiece> pieces;
  format::DType dtype = format::DType::kFloat32;
  bool requires_grad = false;  // any rank's flat tensor's (torch.cat of the fragments keeps it)
  uint64_t numel = 0;
};

struct PendingParam {
  std::map<std::string, PendingState> states;
};

// Adds elements [start, start + numel) of `flat` to `state`.
Status AddFragment(PendingState& state, const StateTensor& flat, uint64_t start, uint64_t numel,
                   const std::string& what) {
  const auto end = CheckedAdd(start, numel);
  if (!end || *end > flat.numel()) {
    return Corrupt(flat.path + ": " + what + " [" + std::to_string(start) + ", +" + std::to_string(numel) +
                   ") lies outside its " + std::to_string(flat.numel()) + "-element flat partition");
  }
  if (!state.pieces.empty() && state.dtype != flat.dtype) {
    return Corrupt(flat.path + ": " + what + " is " + std::string(format::TorchName(flat.dtype)) +
                   " but another rank's fragment is " + std::string(format::TorchName(state.dtype)));
  }
  state.requires_grad = state.requires_grad || flat.requires_grad;
  state.dtype = flat.dtype;
  if (numel == 0) return Status::Ok();
  state.pieces.push_back(TensorPiece{flat.path, flat.data_offset + start * format::ItemSize(flat.dtype), numel});
  state.numel += numel;
  return Status::Ok();
}

// Python's re.match: the pattern anchored at the start of the name only.
bool ReMatch(const std::string& pattern, const std::string& name) {
  try {
    return std::regex_search(name, std::regex(pattern, std::regex::ECMAScript), std::regex_constants::match_continuous);
  } catch (const std::regex_error&) {
    return false;
  }
}

bool AnyMatch(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(), [&](const std::string& p) { return ReMatch(p, name); });
}

}  // namespace

// Builds a ucp::UniversalCheckpoint from native files (a friend: it fills the same members
// UniversalCheckpoint::Open fills, and runs the same checks).
class NativeReader {
 public:
  static Result<ucp::UniversalCheckpoint> Open(const std::string& path);

 private:
  struct OptimFile {
    std::string name;
    int32_t tp = 0;
    int32_t dp = 0;
  };

  explicit NativeReader(ucp::UniversalCheckpoint& ckpt) : ckpt_(ckpt) {}

  Status ListFiles();
  Status OpenOptimFiles();
  Status CheckRanksAgree() const;
  Status IndexZero12(const ucp::GroupShapes& shapes);
  Status IndexZero3(const ucp::GroupShapes& shapes);
  Status AddUnlisted(const std::set<std::string>& listed);
  Result<ucp::ParamCategories> Categories(const std::string& name, std::vector<int64_t>& shape,
                                          PendingParam& pending) const;
  Result<ParamEntry> Finish(const std::string& name, int32_t group, const std::vector<int64_t>& shape,
                            PendingParam pending, bool bare) const;

  // The optimizer_state_dict of rank dp's file.
  NodeId OptimRoot(size_t dp) const {
    const PickleTree& t = archives_[dp].tree();
    return format::DictLookup(t, t.root(), "optimizer_state_dict");
  }

  ucp::UniversalCheckpoint& ckpt_;
  std::vector<OptimFile> files_;      // by DP rank (TP 1)
  std::vector<TorchArchive> archives_;  // by DP rank; [0] moves into ckpt_.optimizer_state_ last
};

Status NativeReader::ListFiles() {
  const std::string& dir = ckpt_.dir_;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return IoError(dir + ": cannot list: " + ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return IoError(dir + ": listing failed: " + ec.message());
    const std::string name = it->path().filename().string();
    if (name.rfind("layer_", 0) == 0 || name.rfind("expp_rank_", 0) == 0) {
      const bool moe = name.find("_expert_") != std::string::npos || name.rfind("expp_rank_", 0) == 0;
      return Unsupported(dir + "/" + name + ": " +
                         (moe ? "a MoE expert file; reshardfs serves dense TP x DP checkpoints only"
                              : "a pipeline-parallel layer file; reshardfs serves TP x DP layouts only"));
    }
    if (const auto ranks = ParseOptimName(name)) files_.push_back(OptimFile{name, ranks->first, ranks->second});
  }
  if (files_.empty()) return InvalidArgument(dir + ": no zero_pp_rank_*_mp_rank_*_optim_states.pt files");
  std::sort(files_.begin(), files_.end(),
            [](const OptimFile& a, const OptimFile& b) { return std::make_pair(a.tp, a.dp) < std::make_pair(b.tp, b.dp); });
  const int32_t tp = files_.back().tp + 1;
  if (tp > 1) {
    return Unsupported(dir + ": saved with TP " + std::to_string(tp) +
                       "; reshardfs serves native sources saved without TP (TP 1) so far: convert this one with "
                       "ds_to_universal and mount the result");
  }
  for (size_t d = 0; d < files_.size(); ++d) {
    if (files_[d].dp != static_cast<int32_t>(d)) {
      return NotFound(dir + ": no optimizer file for DP rank " + std::to_string(d) + " (zero_pp_rank_" +
                      std::to_string(d) + "_mp_rank_00_optim_states.pt)" +
                      (files_[d].dp < static_cast<int32_t>(d) ? " or two files for one rank" : ""));
    }
  }
  return Status::Ok();
}

Status NativeReader::OpenOptimFiles() {
  archives_.resize(files_.size());
  return ParallelFor(files_.size(), [&](size_t d) -> Status {
    RS_ASSIGN_OR_RETURN(archives_[d], TorchArchive::Open(ckpt_.dir_ + "/" + files_[d].name));
    const PickleTree& t = archives_[d].tree();
    if (format::DictItems(t, format::DictLookup(t, t.root(), "optimizer_state_dict")) == nullptr) {
      return Corrupt(archives_[d].path() + ": no optimizer_state_dict dict");
    }
    return Status::Ok();
  });
}

// Every rank's file must describe the same run: DeepSpeed's converter assumes it, and a folder
// that mixes saves would otherwise be stitched together silently.
Status NativeReader::CheckRanksAgree() const {
  const PickleTree& t0 = archives_[0].tree();
  const NodeId pc0 = format::DictLookup(t0, OptimRoot(0), "partition_count");
  for (size_t d = 0; d < archives_.size(); ++d) {
    const PickleTree& t = archives_[d].tree();
    auto stage = ucp::ParseZeroStage(t, format::DictLookup(t, OptimRoot(d), "zero_stage"));
    if (!stage.ok()) return stage.status().Annotate(archives_[d].path());
    if (stage->value_or(1) != ckpt_.zero_stage_) {
      return Corrupt(archives_[d].path() + ": zero_stage " + std::to_string(stage->value_or(1)) + " but " +
                     files_[0].name + " says " + std::to_string(ckpt_.zero_stage_));
    }
    const NodeId pc = format::DictLookup(t, OptimRoot(d), "partition_count");
    const auto counts = format::AsIntSequence(t, pc);
    const auto count = format::AsInt(t, pc);
    const bool same = counts ? counts == format::AsIntSequence(t0, pc0) : count == format::AsInt(t0, pc0);
    if (!same) {
      return Corrupt(archives_[d].path() + ": partition_count " + DescribeNode(t, pc) + " disagrees with " +
                     files_[0].name + "'s " + DescribeNode(t0, pc0));
    }
    const std::vector<int64_t> expected = counts ? *counts : std::vector<int64_t>{count.value_or(0)};
    for (int64_t c : expected) {
      if (c != static_cast<int64_t>(archives_.size())) {
        return Corrupt(archives_[d].path() + ": partition_count " + DescribeNode(t, pc) + " but the folder holds " +
                       std::to_string(archives_.size()) + " DP ranks of optimizer files");
      }
    }
  }
  if (ckpt_.dp_world_size_ != static_cast<int32_t>(archives_.size())) {
    return Corrupt(ckpt_.model_states_.front().archive.path() + ": dp_world_size " +
                   std::to_string(ckpt_.dp_world_size_) + " but the folder holds " + std::to_string(archives_.size()) +
                   " DP ranks of optimizer files");
  }
  return Status::Ok();
}

Result<ucp::ParamCategories> NativeReader::Categories(const std::string& name, std::vector<int64_t>& shape,
                                                      PendingParam& pending) const {
  // ds_to_universal's merge_tp_slices, with one TP slice: every branch keeps the slice whole, so
  // only the keys it writes (and the vocabulary rows it strips) differ.
  const ucp::UniversalCheckpointInfo& info = ckpt_.info_;
  ucp::ParamCategories c;
  for (const ucp::AffineSplit& split : info.affine_splits) {
    if (ReMatch(split.pattern, name)) {
      return Unsupported(ckpt_.dir_ + ": '" + name + "' has an affine_map entry; native sources with affine maps "
                                      "are not served yet (convert with ds_to_universal)");
    }
  }
  for (const ucp::SubparamShape& sub : info.parameter_with_sub_params) {
    if (AnyMatch(sub.patterns, name)) {
      return Unsupported(ckpt_.dir_ + ": '" + name + "' is declared with sub-parameters; native sources with "
                                      "sub-parameter patterns are not served yet (convert with ds_to_universal)");
    }
  }
  if (AnyMatch(info.tp_replicated_parameter_patterns, name) || AnyMatch(info.parameter_to_average_patterns, name)) {
    // The converter writes no category keys for these (an average of one slice is the slice).
  } else if (AnyMatch(info.parameter_with_2_sub_params_cat_dim_0, name)) {
    c.cat_dim = 0;
    c.param_n_sub_params = 2;
  } else {
    c.cat_dim = AnyMatch(info.parameter_with_row_parallelism_patterns, name) ? 1 : 0;
  }
  if (AnyMatch(info.vocabulary_parameter_patterns, name)) {
    if (!info.original_vocab_size || shape.empty()) {
      return Corrupt(ckpt_.dir_ + ": '" + name + "' matches a vocabulary pattern but universal_checkpoint_info has "
                                  "no original_vocab_size (or the parameter has no rows)");
    }
    const int64_t rows = std::min<int64_t>(*info.original_vocab_size, shape[0]);
    shape[0] = rows;
    const uint64_t keep = *Numel(shape);  // smaller than the checked original
    for (auto& [key, state] : pending.states) {
      uint64_t left = keep;
      std::vector<TensorPiece> kept;
      for (TensorPiece p : state.pieces) {
        if (left == 0) break;
        p.numel = std::min(p.numel, left);
        left -= p.numel;
        kept.push_back(std::move(p));
      }
      state.pieces = std::move(kept);
      state.numel = keep;
    }
    c.vocab_tensor = true;
  }
  return c;
}

Result<ParamEntry> NativeReader::Finish(const std::string& name, int32_t group, const std::vector<int64_t>& shape,
                                        PendingParam pending, bool bare) const {
  ParamEntry e;
  e.name = name;
  e.dir = ckpt_.dir_;
  e.listed = true;
  e.source_group = group;
  e.tp_shapes = {shape};
  e.bare_tensor = bare;
  std::vector<int64_t> full = shape;
  const auto numel = Numel(shape);
  if (!numel) return Corrupt(ckpt_.dir_ + ": param_shapes gives '" + name + "' too many elements");
  for (const char* key : kStates) {
    const PendingState& s = pending.states[key];
    if (s.numel != *numel) {
      return Corrupt(ckpt_.dir_ + ": the optimizer files' fragments of '" + name + "' " + key + " hold " +
                     std::to_string(s.numel) + " elements but param_shapes records " + std::to_string(*numel));
    }
  }
  if (!bare) {
    RS_ASSIGN_OR_RETURN(e.categories, Categories(name, full, pending));
  }
  e.full_shape = bare ? std::vector<int64_t>{static_cast<int64_t>(*numel)} : full;
  for (const char* key : kStates) {
    PendingState& s = pending.states[key];
    StateTensor t;
    t.dtype = s.dtype;
    t.requires_grad = s.requires_grad;
    t.shape = e.full_shape;
    t.nbytes = s.numel * format::ItemSize(s.dtype);
    if (!s.pieces.empty()) {
      t.path = s.pieces.front().path;
      t.data_offset = s.pieces.front().data_offset;
    } else {
      t.path = ckpt_.dir_;
    }
    // One piece is a plain run of one file, as a universal state file would be.
    if (s.pieces.size() > 1) t.pieces = std::move(s.pieces);
    e.states.emplace(key, std::move(t));
  }
  return e;
}

Status NativeReader::IndexZero12(const ucp::GroupShapes& shapes) {
  const size_t groups = shapes.size();
  std::map<std::string, PendingParam> pending;
  std::vector<std::optional<ucp::Step>> steps(groups);
  for (size_t d = 0; d < archives_.size(); ++d) {
    const TorchArchive& a = archives_[d];
    const PickleTree& t = a.tree();
    const NodeId osd = OptimRoot(d);
    const std::vector<NodeId>* fp32 = format::SequenceItems(t, format::DictLookup(t, osd, "single_partition_of_fp32_groups"));
    const std::vector<NodeId>* maps = format::SequenceItems(t, format::DictLookup(t, osd, "param_slice_mappings"));
    const NodeId state = format::DictLookup(t, format::DictLookup(t, osd, "base_optimizer_state"), "state");
    if (fp32 == nullptr || maps == nullptr || format::DictItems(t, state) == nullptr) {
      return Corrupt(a.path() + ": optimizer_state_dict lacks single_partition_of_fp32_groups, param_slice_mappings "
                                "or base_optimizer_state.state");
    }
    if (fp32->size() != groups || maps->size() != groups) {
      return Corrupt(a.path() + ": " + std::to_string(fp32->size()) + " fp32 partitions and " +
                     std::to_string(maps->size()) + " param_slice_mappings, but param_shapes has " +
                     std::to_string(groups) + " groups");
    }
    for (size_t g = 0; g < groups; ++g) {
      const std::string where = "group " + std::to_string(g);
      const NodeId gs = IntKeyLookup(t, state, static_cast<int64_t>(g));
      if (format::DictItems(t, gs) == nullptr) {
        return Unsupported(a.path() + ": base_optimizer_state.state has no entry for " + where +
                           " (a group that never took an optimizer step)");
      }
      std::map<std::string, StateTensor> flats;
      RS_ASSIGN_OR_RETURN(flats["fp32"], FlatTensor(a, (*fp32)[g], "single_partition_of_fp32_groups[" + std::to_string(g) + "]"));
      for (const char* key : {"exp_avg", "exp_avg_sq"}) {
        RS_ASSIGN_OR_RETURN(flats[key], FlatTensor(a, format::DictLookup(t, gs, key), where + " " + key));
        if (flats[key].numel() != flats["fp32"].numel()) {
          return Corrupt(a.path() + ": " + where + " " + key + " has " + std::to_string(flats[key].numel()) +
                         " elements, its fp32 partition " + std::to_string(flats["fp32"].numel()));
        }
      }
      const NodeId step_node = format::DictLookup(t, gs, "step");
      if (step_node != kNoNode) {
        RS_ASSIGN_OR_RETURN(ucp::Step step, ucp::ParseStep(a, step_node));
        if (!steps[g]) {
          steps[g] = step;
        } else if (steps[g]->is_tensor != step.is_tensor || steps[g]->value != step.value) {
          return Corrupt(a.path() + ": " + where + " step " + std::to_string(step.value) + " disagrees with DP rank 0's " +
                         std::to_string(steps[g]->value));
        }
      }
      const std::vector<NodeId>* items = format::DictItems(t, (*maps)[g]);
      if (items == nullptr) return Corrupt(a.path() + ": param_slice_mappings[" + std::to_string(g) + "] is not a dict");
      for (size_t i = 0; i + 1 < items->size(); i += 2) {
        const auto name = format::AsStr(t, (*items)[i]);
        const NodeId frag = format::ObjectState(t, (*items)[i + 1]);
        const auto start = format::AsInt(t, format::DictLookup(t, frag, "start"));
        const auto numel = format::AsInt(t, format::DictLookup(t, frag, "numel"));
        if (!name || !start || !numel || *start < 0 || *numel < 0) {
          return Corrupt(a.path() + ": param_slice_mappings[" + std::to_string(g) + "] entry " +
                         DescribeNode(t, (*items)[i]) + " is not a name -> fragment_address(start, numel)");
        }
        PendingParam& p = pending[std::string(*name)];
        for (const char* key : kStates) {
          RS_RETURN_IF_ERROR(AddFragment(p.states[key], flats[key], static_cast<uint64_t>(*start),
                                         static_cast<uint64_t>(*numel),
                                         "fragment of '" + std::string(*name) + "' " + key));
        }
      }
    }
  }
  std::set<std::string> listed;
  for (size_t g = 0; g < groups; ++g) {
    for (const auto& [name, shape] : shapes[g]) {
      auto it = pending.find(name);
      if (it == pending.end()) {
        return Unsupported(ckpt_.dir_ + ": no optimizer file holds a fragment of '" + name +
                           "', which param_shapes lists");
      }
      RS_ASSIGN_OR_RETURN(ParamEntry e, Finish(name, static_cast<int32_t>(g), shape, std::move(it->second), false));
      pending.erase(it);
      e.step = steps[g];
      listed.insert(name);
      ckpt_.params_.push_back(std::move(e));
    }
  }
  if (!pending.empty()) {
    return Corrupt(ckpt_.dir_ + ": param_slice_mappings names '" + pending.begin()->first +
                   "', which param_shapes does not list");
  }
  return AddUnlisted(listed);
}

// The converter writes zero/<name>/fp32.pt = module[name].float() for every module entry that got
// no optimizer state; with float32 module entries that is the entry itself.
Status NativeReader::AddUnlisted(const std::set<std::string>& listed) {
  const TorchArchive& a = ckpt_.model_states_.front().archive;
  const PickleTree& t = a.tree();
  const std::vector<NodeId>* items = format::DictItems(t, format::DictLookup(t, t.root(), "module"));
  if (items == nullptr) return Status::Ok();
  std::vector<ParamEntry> unlisted;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    const auto name = format::AsStr(t, (*items)[i]);
    if (!name || listed.count(std::string(*name)) > 0) continue;
    auto ref = format::MatchTensor(t, (*items)[i + 1]);
    if (!ref.ok() || !*ref || (*ref)->dtype != format::DType::kFloat32 || !(*ref)->is_contiguous()) continue;
    auto located = ucp::LocateTensor(a, **ref);
    if (!located.ok()) return std::move(located.status()).Annotate(a.path() + ": module entry '" + std::string(*name) + "'");
    ParamEntry e;
    e.name = std::string(*name);
    e.dir = ckpt_.dir_;
    e.full_shape = located->shape;
    e.states.emplace("fp32", std::move(located).value());
    unlisted.push_back(std::move(e));
  }
  std::sort(unlisted.begin(), unlisted.end(), [](const ParamEntry& x, const ParamEntry& y) { return x.name < y.name; });
  for (ParamEntry& e : unlisted) ckpt_.params_.push_back(std::move(e));
  return Status::Ok();
}

Status NativeReader::IndexZero3(const ucp::GroupShapes& shapes) {
  const uint64_t world = archives_.size();
  std::vector<std::map<std::string, PendingParam>> pending(shapes.size());
  for (size_t d = 0; d < archives_.size(); ++d) {
    const TorchArchive& a = archives_[d];
    const PickleTree& t = a.tree();
    const NodeId osd = OptimRoot(d);
    const NodeId partition_groups = format::DictLookup(t, osd, "ds_zero_partition_groups");
    const std::vector<NodeId>* pg = format::SequenceItems(t, partition_groups);
    if (partition_groups != kNoNode && !format::IsNone(t, partition_groups) && (pg == nullptr || !pg->empty())) {
      return Unsupported(a.path() + ": ds_zero_partition_groups (partitions other than the DP group) is not served");
    }
    const std::vector<NodeId>* flats = format::SequenceItems(t, format::DictLookup(t, osd, "fp32_flat_groups"));
    const NodeId state = format::DictLookup(t, format::DictLookup(t, osd, "optimizer_state_dict"), "state");
    if (flats == nullptr || format::DictItems(t, state) == nullptr) {
      return Corrupt(a.path() + ": optimizer_state_dict lacks fp32_flat_groups or optimizer_state_dict.state");
    }
    if (flats->size() != shapes.size()) {
      return Corrupt(a.path() + ": " + std::to_string(flats->size()) + " fp32_flat_groups but param_shapes has " +
                     std::to_string(shapes.size()) + " sub-groups");
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      const std::string where = "sub-group " + std::to_string(i);
      const NodeId ss = IntKeyLookup(t, state, static_cast<int64_t>(i));
      if (format::DictItems(t, ss) == nullptr) {
        return Unsupported(a.path() + ": optimizer_state_dict.state has no entry for " + where);
      }
      std::map<std::string, StateTensor> flat;
      RS_ASSIGN_OR_RETURN(flat["fp32"], FlatTensor(a, (*flats)[i], "fp32_flat_groups[" + std::to_string(i) + "]"));
      for (const char* key : {"exp_avg", "exp_avg_sq"}) {
        RS_ASSIGN_OR_RETURN(flat[key], FlatTensor(a, format::DictLookup(t, ss, key), where + " " + key));
      }
      uint64_t offset = 0;
      for (const auto& [name, shape] : shapes[i]) {
        const auto numel = Numel(shape);
        if (!numel) return Corrupt(a.path() + ": '" + name + "' has too many elements");
        const uint64_t part = (*numel + world - 1) / world;  // ceil(numel / DP): each rank's slot
        const uint64_t begin = std::min(*numel, d * part);
        const uint64_t real = std::min(part, *numel - begin);
        for (const char* key : kStates) {
          RS_RETURN_IF_ERROR(AddFragment(pending[i][name].states[key], flat[key], offset, real,
                                         "partition of '" + name + "' " + key));
        }
        offset += part;
      }
      for (const char* key : kStates) {
        if (offset > flat[key].numel()) {
          return Corrupt(a.path() + ": " + where + " " + key + " has " + std::to_string(flat[key].numel()) +
                         " elements, its parameters' partitions need " + std::to_string(offset));
        }
      }
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (const auto& [name, shape] : shapes[i]) {
      RS_ASSIGN_OR_RETURN(ParamEntry e,
                          Finish(name, static_cast<int32_t>(i), shape, std::move(pending[i][name]), /*bare=*/true));
      ckpt_.params_.push_back(std::move(e));
    }
  }
  return Status::Ok();
}

Result<ucp::UniversalCheckpoint> NativeReader::Open(const std::string& path) {
  ucp::UniversalCheckpoint ckpt;
  NativeReader r(ckpt);
  RS_ASSIGN_OR_RETURN(ckpt.dir_, ResolveTagDir(StripTrailingSlashes(path)));
  ckpt.tag_ = fs::path(ckpt.dir_).filename().string();
  ckpt.native_ = true;
  RS_RETURN_IF_ERROR(r.ListFiles());
  RS_RETURN_IF_ERROR(r.OpenOptimFiles());
  {
    const PickleTree& t = r.archives_[0].tree();
    const NodeId osd = r.OptimRoot(0);
    auto stage = ucp::ParseZeroStage(t, format::DictLookup(t, osd, "zero_stage"));
    if (!stage.ok()) return stage.status().Annotate(r.archives_[0].path());
    ckpt.zero_stage_recorded_ = stage->has_value();
    ckpt.zero_stage_ = stage->value_or(1);
    // What ds_to_universal stores as zero/optimizer_state.pt's param_groups.
    const NodeId inner = format::DictLookup(t, osd, ckpt.zero_stage_ == 3 ? "optimizer_state_dict" : "base_optimizer_state");
    auto groups = ucp::ParseParamGroups(t, format::DictLookup(t, inner, "param_groups"));
    if (!groups.ok()) return groups.status().Annotate(r.archives_[0].path());
    ckpt.param_groups_ = std::move(groups).value();
  }
  RS_RETURN_IF_ERROR(ckpt.LoadModelStates());
  RS_RETURN_IF_ERROR(ckpt.LoadSourceLayout());
  RS_RETURN_IF_ERROR(r.CheckRanksAgree());
  const TorchArchive& model0 = ckpt.model_states_.front().archive;
  auto shapes = ucp::ParseParamShapes(model0.tree(), format::DictLookup(model0.tree(), model0.tree().root(), "param_shapes"));
  if (!shapes.ok()) return shapes.status().Annotate(model0.path());
  ckpt.num_source_groups_ = static_cast<int32_t>(shapes->size());
  RS_RETURN_IF_ERROR(ckpt.CheckParamGroups());
  if (ckpt.zero_stage_ == 3) {
    RS_RETURN_IF_ERROR(r.IndexZero3(*shapes));
  } else {
    RS_RETURN_IF_ERROR(r.IndexZero12(*shapes));
  }
  for (size_t k = 0; k < ckpt.params_.size(); ++k) {
    if (!ckpt.param_index_.emplace(ckpt.params_[k].name, k).second) {
      return Corrupt(model0.path() + ": param_shapes lists '" + ckpt.params_[k].name + "' twice");
    }
  }
  RS_RETURN_IF_ERROR(ckpt.MatchAffineSplits());
  ckpt.optimizer_state_ = std::move(r.archives_[0]);
  ckpt.optimizer_state_root_ = format::DictLookup(ckpt.optimizer_state_.tree(), ckpt.optimizer_state_.tree().root(),
                                                  "optimizer_state_dict");
  return ckpt;
}

Result<ucp::UniversalCheckpoint> OpenNativeCheckpoint(const std::string& path) { return NativeReader::Open(path); }

bool LooksNative(const std::string& path) {
  const std::string dir = StripTrailingSlashes(path);
  if (HasOptimFiles(dir)) return true;
  return IsFile(dir + "/latest") && !IsDir(dir + "/zero") && !IsFile(dir + "/latest_universal");
}

Result<ucp::UniversalCheckpoint> OpenCheckpointSource(const std::string& path) {
  if (LooksNative(path)) return OpenNativeCheckpoint(path);
  return ucp::UniversalCheckpoint::Open(path);
}

}  // namespace reshard::native
