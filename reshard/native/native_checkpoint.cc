#include "reshard/native/native_checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string_view>
#include <tuple>
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
using ucp::IsDir;
using ucp::IsFile;
using ucp::ShapeNumel;
using ucp::StripTrailingSlashes;
using format::kNoNode;
using format::NodeId;
using format::PickleTree;
using format::TorchArchive;
using ucp::ParamEntry;
using ucp::StateTensor;
using ucp::TensorPiece;

namespace {

constexpr std::string_view kOptimSuffix = "_optim_states.pt";
constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};
// The most memory the averaged parameters' computed states may take (they are norms and biases:
// a 70B Megatron model at TP 8 needs a few MiB).
constexpr uint64_t kMaxComputedBytes = uint64_t{256} << 20;

// "[bf16_]zero_pp_rank_<dp>_mp_rank_<tp>_optim_states.pt" -> (tp, dp).
std::optional<std::pair<int32_t, int32_t>> ParseOptimName(std::string_view name) {
  const std::optional<ucp::RankFileName> r = ucp::ParseRankFileName(name, kOptimSuffix);
  if (!r || !r->zero3) return std::nullopt;
  return std::make_pair(r->tp, r->dp);
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
  RS_ASSIGN_OR_RETURN(std::string dir, ucp::FollowTagFile(path, "latest"));
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
  std::shared_ptr<const std::string> computed;  // the TP average, instead of pieces
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

// One DP rank's flat partitions of one param group (fp32, exp_avg, exp_avg_sq) and its
// param_slice_mappings entries (name, start, numel), in file order.
struct RankGroup {
  std::map<std::string, StateTensor> flats;
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> slices;
};

// True when the DP ranks' param_slice_mappings place the group's parameters in another order than
// `shapes` (param_shapes, which lists them in the order of the flat buffer). DeepSpeed 0.19.8 saves
// such mappings with round_robin_gradients: the buffer is flattened in round-robin order, but
// link_hp_params, given no per-parameter offsets when no alignment padding is needed, maps every
// parameter at its offset in the model's order. ds_to_universal follows those mappings and writes
// misplaced parameters (fc2's values under head, ...); zero_to_fp32 walks param_shapes and gets
// them right.
bool MappingsDisagreeWithOrder(const std::vector<RankGroup>& ranks,
                               const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  std::map<std::string, uint64_t> first;  // name -> its lowest start in the whole group flat
  uint64_t base = 0;
  for (const RankGroup& r : ranks) {
    for (const auto& [name, start, numel] : r.slices) {
      if (numel > 0 && !first.count(name)) first[name] = base + start;
    }
    base += r.flats.at("fp32").numel();
  }
  std::set<std::string> listed;
  for (const auto& entry : shapes) listed.insert(entry.first);
  std::vector<std::pair<uint64_t, std::string>> by_start;
  for (const auto& [name, start] : first) {
    if (!listed.count(name)) return false;  // reported as a name param_shapes does not list
    by_start.emplace_back(start, name);
  }
  std::sort(by_start.begin(), by_start.end());
  size_t k = 0;
  for (const auto& [name, shape] : shapes) {
    if (!first.count(name)) continue;
    if (k >= by_start.size() || by_start[k].second != name) return true;
    ++k;
  }
  return false;
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

// Consumes one TP rank's state, in element order, in runs over its pieces: the TP merge takes
// each rank's consecutive blocks in turn.
class RunCursor {
 public:
  RunCursor(const std::vector<TensorPiece>& pieces, uint64_t itemsize) : pieces_(&pieces), itemsize_(itemsize) {}

  // Appends the next `n` elements (the caller checked they exist) to `out`, merging runs that
  // continue the last one in the same file.
  void Take(uint64_t n, std::vector<TensorPiece>& out) {
    while (n > 0) {
      const TensorPiece& p = (*pieces_)[index_];
      const uint64_t k = std::min(n, p.numel - offset_);
      const uint64_t at = p.data_offset + offset_ * itemsize_;
      if (!out.empty() && out.back().path == p.path && out.back().data_offset + out.back().numel * itemsize_ == at) {
        out.back().numel += k;
      } else {
        out.push_back(TensorPiece{p.path, at, k});
      }
      offset_ += k;
      n -= k;
      if (offset_ == p.numel) {
        ++index_;
        offset_ = 0;
      }
    }
  }

 private:
  const std::vector<TensorPiece>* pieces_;
  uint64_t itemsize_;
  size_t index_ = 0;
  uint64_t offset_ = 0;
};

// How ds_to_universal's merge_tp_slices joins a parameter's TP slices.
struct MergeRule {
  bool replicated = false;  // every rank holds the whole tensor: rank 0's is kept
  size_t dim = 0;           // else: the slices are concatenated along this dim
  // A fused affine split: [sub-parameter][rank] block widths along `dim`; the full tensor is, per
  // outer index, every rank's block of sub-parameter 0, then of sub-parameter 1, ...
  std::vector<std::vector<int64_t>> sub_widths;
  // parameter_with_2_sub_params_cat_dim_0: each slice is torch.chunk(slice, 2, dim 0) of the two
  // sub-parameters, i.e. sub_widths of ceil(rows / 2) and the rest, known once the shapes are.
  bool two_sub_params = false;
  // parameter_to_average_patterns at TP > 1: the mean of the slices, computed (MeanOfSlices).
  bool averaged = false;
  ucp::ParamCategories categories;
  bool vocab = false;  // then the rows past original_vocab_size are stripped
};

// ZeRO-Infinity with offload_optimizer.device "nvme" keeps the fp32 partitions and Adam moments in
// swap files outside the checkpoint; a save that holds empty tensors in their place lacks them.
// Say that, rather than the fragment arithmetic that would fail on them.
Status CheckNotSwappedOut(const TorchArchive& a) {
  const PickleTree& t = a.tree();
  const NodeId zero = format::DictLookup(t, format::DictLookup(t, t.root(), "ds_config"), "zero_optimization");
  const auto device = format::AsStr(t, format::DictLookup(t, format::DictLookup(t, zero, "offload_optimizer"), "device"));
  if (!device || *device != "nvme") return Status::Ok();
  const NodeId osd = format::DictLookup(t, t.root(), "optimizer_state_dict");
  for (const char* key : {"fp32_flat_groups", "single_partition_of_fp32_groups"}) {
    const std::vector<NodeId>* flats = format::SequenceItems(t, format::DictLookup(t, osd, key));
    if (flats == nullptr) continue;
    for (const NodeId flat : *flats) {
      const auto ref = format::MatchTensor(t, flat);
      if (ref.ok() && *ref && (*ref)->numel() == 0) {
        return Unsupported(a.path() + ": " + key + " holds an empty tensor and its ds_config offloads the optimizer "
                           "to NVMe (offload_optimizer.device 'nvme'): the optimizer states are not in this folder");
      }
    }
  }
  return Status::Ok();
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
  // `shapes`: each TP rank's param_shapes (its model-states file's).
  Status IndexZero12(const std::vector<ucp::GroupShapes>& shapes);
  Status IndexZero3(const std::vector<ucp::GroupShapes>& shapes);
  Status AddUnlisted(const std::set<std::string>& listed);
  // Adds one TP rank's fragments of one param group (`ranks` by DP rank) to `pending`: through
  // param_slice_mappings, or, where those disagree with param_shapes' order (DeepSpeed's
  // round-robin defect, see MappingsDisagreeWithOrder), through param_shapes' order itself.
  Status AddGroupFragments(const std::vector<RankGroup>& ranks,
                           const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                           std::map<std::string, PendingParam>& pending) const;
  Result<MergeRule> Rule(const std::string& name) const;
  // The parameter `name` of param_shapes group `group` from its TP slices (`shapes` and `parts`
  // by TP rank), as the converter writes it.
  Result<ParamEntry> Finish(const std::string& name, int32_t group, const std::vector<std::vector<int64_t>>& shapes,
                            std::vector<PendingParam> parts, bool bare);
  // The converter's `sum(slices) / len(slices)` of state `key` of `parts` (float32, equal shapes),
  // in its order of operations, read from the optimizer files' mappings; counted against
  // kMaxComputedBytes.
  Result<std::shared_ptr<const std::string>> MeanOfSlices(const std::string& name, const char* key,
                                                          const std::vector<PendingParam>& parts);

  // The optimizer_state_dict of the file at archives_ index `i` (At(tp, dp)).
  NodeId OptimRoot(size_t i) const {
    const PickleTree& t = archives_[i].tree();
    return format::DictLookup(t, t.root(), "optimizer_state_dict");
  }
  size_t At(int32_t tp, int32_t dp) const { return static_cast<size_t>(tp) * static_cast<size_t>(dp_) + dp; }

  ucp::UniversalCheckpoint& ckpt_;
  int32_t tp_ = 1;  // TP ranks of optimizer files
  int32_t dp_ = 1;  // DP ranks of optimizer files
  std::vector<OptimFile> files_;        // by (TP, DP) rank: At(tp, dp)
  std::vector<TorchArchive> archives_;  // the same order; [0] moves into ckpt_.optimizer_state_ last
  uint64_t computed_bytes_ = 0;         // held by averaged parameters' computed states so far
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
  tp_ = files_.back().tp + 1;
  for (const OptimFile& f : files_) dp_ = std::max(dp_, f.dp + 1);
  // Sorted by (tp, dp): walking the expected grid finds a missing rank and a duplicate alike.
  size_t k = 0;
  for (int32_t t = 0; t < tp_; ++t) {
    for (int32_t d = 0; d < dp_; ++d, ++k) {
      if (k >= files_.size() || files_[k].tp != t || files_[k].dp != d) {
        char name[64];
        std::snprintf(name, sizeof name, "zero_pp_rank_%d_mp_rank_%02d_optim_states.pt", d, t);
        return NotFound(dir + ": no optimizer file for DP rank " + std::to_string(d) + " of TP rank " +
                        std::to_string(t) + " (" + name + ") or two files for one rank");
      }
    }
  }
  if (k != files_.size()) return Corrupt(dir + ": the optimizer files do not form a complete TP x DP grid");
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
    return CheckNotSwappedOut(archives_[d]);
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
      if (c != dp_) {
        return Corrupt(archives_[d].path() + ": partition_count " + DescribeNode(t, pc) + " but the folder holds " +
                       std::to_string(dp_) + " DP ranks of optimizer files");
      }
    }
  }
  if (ckpt_.dp_world_size_ != dp_ || ckpt_.tp_degree_ != tp_) {
    return Corrupt(ckpt_.model_states_.front().archive.path() + ": a TP " + std::to_string(ckpt_.tp_degree_) + " x DP " +
                   std::to_string(ckpt_.dp_world_size_) + " run, but the folder holds TP " + std::to_string(tp_) +
                   " x DP " + std::to_string(dp_) + " optimizer files");
  }
  return Status::Ok();
}

Result<MergeRule> NativeReader::Rule(const std::string& name) const {
  // merge_tp_slices' branches, in its order: an affine map, else the category patterns; the
  // vocabulary strip applies after any of them.
  const ucp::UniversalCheckpointInfo& info = ckpt_.info_;
  const std::string where = ckpt_.dir_ + ": '" + name + "' ";
  const std::string convert = "; not served from a native source yet (convert with ds_to_universal)";
  MergeRule rule;
  const auto split = std::find_if(info.affine_splits.begin(), info.affine_splits.end(),
                                  [&](const ucp::AffineSplit& s) { return ReMatch(s.pattern, name); });
  if (split != info.affine_splits.end()) {
    rule.replicated = !split->partition_dim.has_value();
    rule.dim = static_cast<size_t>(split->partition_dim.value_or(0));
    rule.sub_widths = split->sub_param_rank_widths;
  } else if (std::any_of(info.parameter_with_sub_params.begin(), info.parameter_with_sub_params.end(),
                         [&](const ucp::SubparamShape& sub) { return AnyMatch(sub.patterns, name); })) {
    return Unsupported(where + "is declared with sub-parameters" + convert);
  } else if (AnyMatch(info.tp_replicated_parameter_patterns, name)) {
    rule.replicated = true;
  } else if (AnyMatch(info.parameter_to_average_patterns, name)) {
    // The converter averages the slices; of one slice that is the slice itself.
    rule.averaged = tp_ > 1;
    rule.replicated = !rule.averaged;
  } else if (AnyMatch(info.parameter_with_2_sub_params_cat_dim_0, name)) {
    rule.two_sub_params = true;
    rule.categories.cat_dim = 0;
    rule.categories.param_n_sub_params = 2;
  } else {
    rule.dim = AnyMatch(info.parameter_with_row_parallelism_patterns, name) ? 1 : 0;
    rule.categories.cat_dim = static_cast<int64_t>(rule.dim);
  }
  if (AnyMatch(info.vocabulary_parameter_patterns, name)) {
    if (!info.original_vocab_size) {
      return Corrupt(where + "matches a vocabulary pattern but universal_checkpoint_info has no original_vocab_size");
    }
    rule.vocab = true;
    rule.categories.vocab_tensor = true;
  }
  return rule;
}

Result<std::shared_ptr<const std::string>> NativeReader::MeanOfSlices(const std::string& name, const char* key,
                                                                      const std::vector<PendingParam>& parts) {
  const std::string what = ckpt_.dir_ + ": '" + name + "' " + key;
  const PendingState& first = parts[0].states.at(key);
  if (first.dtype != format::DType::kFloat32) {
    return Unsupported(what + " is averaged over its TP slices but stored in " +
                       std::string(format::TorchName(first.dtype)) + "; reshardfs averages float32 states only");
  }
  const uint64_t nbytes = first.numel * sizeof(float);  // numel checked against param_shapes
  if (nbytes > kMaxComputedBytes - computed_bytes_) {
    return ResourceExhausted(what + ": the averaged parameters' states need more than " +
                             std::to_string(kMaxComputedBytes >> 20) +
                             " MiB in memory; convert this checkpoint with ds_to_universal");
  }
  computed_bytes_ += nbytes;
  // The optimizer files stay mapped while the reader runs: the fragments are read from there.
  std::map<std::string_view, const MappedFile*> files;
  for (const TorchArchive& a : archives_) files.emplace(a.path(), &a.file());
  std::vector<float> acc(first.numel, 0.0f), slice(first.numel);
  for (const PendingParam& part : parts) {
    uint8_t* out = reinterpret_cast<uint8_t*>(slice.data());
    for (const TensorPiece& p : part.states.at(key).pieces) {
      const auto file = files.find(p.path);
      if (file == files.end() || !RangeFits(p.data_offset, p.numel * sizeof(float), file->second->size())) {
        return Corrupt(what + ": a fragment lies outside " + p.path);
      }
      std::memcpy(out, file->second->data() + p.data_offset, p.numel * sizeof(float));
      out += p.numel * sizeof(float);
    }
    // Python's sum() starts from 0 and adds the slices in rank order: 0 + s0 + s1 + ... (so -0.0
    // becomes +0.0, as there).
    for (uint64_t i = 0; i < first.numel; ++i) acc[i] += slice[i];
  }
  // torch divides a float32 tensor by the int len() in float32: a true division, not a
  // multiplication by 1/n (they differ for n = 3).
  const auto n = static_cast<float>(parts.size());
  for (float& v : acc) v /= n;
  return std::make_shared<const std::string>(reinterpret_cast<const char*>(acc.data()), nbytes);
}

Result<ParamEntry> NativeReader::Finish(const std::string& name, int32_t group,
                                        const std::vector<std::vector<int64_t>>& shapes,
                                        std::vector<PendingParam> parts, bool bare) {
  ParamEntry e;
  e.name = name;
  e.dir = ckpt_.dir_;
  e.listed = true;
  e.source_group = group;
  e.tp_shapes = shapes;
  e.bare_tensor = bare;
  for (size_t t = 0; t < parts.size(); ++t) {
    const auto numel = ShapeNumel(shapes[t]);
    if (!numel) return Corrupt(ckpt_.dir_ + ": param_shapes gives '" + name + "' too many elements");
    for (const char* key : kStates) {
      const PendingState& s = parts[t].states[key];
      if (s.numel != *numel) {
        return Corrupt(ckpt_.dir_ + ": the TP rank " + std::to_string(t) + " optimizer files' fragments of '" + name +
                       "' " + key + " hold " + std::to_string(s.numel) + " elements but param_shapes records " +
                       std::to_string(*numel));
      }
      if (s.dtype != parts[0].states[key].dtype) {
        return Corrupt(ckpt_.dir_ + ": '" + name + "' " + key + " is stored in different dtypes by TP ranks 0 and " +
                       std::to_string(t));
      }
    }
  }
  std::vector<int64_t> full = shapes[0];
  std::map<std::string, PendingState> merged;
  MergeRule rule;
  if (!bare) {
    RS_ASSIGN_OR_RETURN(rule, Rule(name));
    e.categories = rule.categories;
  }
  if (rule.two_sub_params && parts.size() > 1) {
    rule.sub_widths.assign(2, {});
    for (const std::vector<int64_t>& shape : shapes) {
      if (shape.empty() || shape[0] < 2) {
        return Corrupt(ckpt_.dir_ + ": '" + name + "' holds 2 sub-parameters along dim 0 but a TP slice has fewer "
                       "than 2 rows");
      }
      rule.sub_widths[0].push_back((shape[0] + 1) / 2);
      rule.sub_widths[1].push_back(shape[0] - (shape[0] + 1) / 2);
    }
  }
  if (rule.averaged && parts.size() > 1) {
    for (size_t t = 1; t < shapes.size(); ++t) {
      if (shapes[t] != shapes[0]) {
        return Corrupt(ckpt_.dir_ + ": '" + name + "' is averaged over its TP slices, but TP ranks 0 and " +
                       std::to_string(t) + " hold different shapes");
      }
    }
    for (const char* key : kStates) {
      PendingState out;
      out.dtype = parts[0].states[key].dtype;
      out.numel = parts[0].states[key].numel;
      for (const PendingParam& part : parts) out.requires_grad = out.requires_grad || part.states.at(key).requires_grad;
      RS_ASSIGN_OR_RETURN(out.computed, MeanOfSlices(name, key, parts));
      merged.emplace(key, std::move(out));
    }
  } else if (bare || rule.replicated || parts.size() == 1) {
    merged = std::move(parts[0].states);
  } else {
    // Concatenation along `dim`: each of the `outer` blocks of the result is every rank's block in
    // rank order (one block when dim is 0; one per row for a row-parallel weight).
    const size_t d = rule.dim;
    for (size_t t = 0; t < shapes.size(); ++t) {
      const std::vector<int64_t>& s = shapes[t];
      bool same = s.size() == full.size() && d < s.size();
      for (size_t k = 0; same && k < s.size(); ++k) same = k == d || s[k] == full[k];
      int64_t fused = 0;
      for (const std::vector<int64_t>& w : rule.sub_widths) {
        if (w.size() != shapes.size()) {
          return Corrupt(ckpt_.dir_ + ": the affine_map of '" + name + "' has " + std::to_string(w.size()) +
                         " ranks' blocks, the folder " + std::to_string(shapes.size()) + " TP ranks");
        }
        fused += w[t];
      }
      if (!same || (!rule.sub_widths.empty() && fused != s[d])) {
        return Corrupt(ckpt_.dir_ + ": the TP slices of '" + name + "' do not join along dim " + std::to_string(d) +
                       (rule.sub_widths.empty() ? "" : " as its affine_map's sub-parameter blocks"));
      }
    }
    uint64_t outer = 1, inner = 1;
    for (size_t k = 0; k < d; ++k) outer *= static_cast<uint64_t>(full[k]);
    for (size_t k = d + 1; k < full.size(); ++k) inner *= static_cast<uint64_t>(full[k]);
    full[d] = 0;
    for (const std::vector<int64_t>& s : shapes) full[d] += s[d];
    for (const char* key : kStates) {
      PendingState out;
      out.dtype = parts[0].states[key].dtype;
      const uint64_t itemsize = format::ItemSize(out.dtype);
      std::vector<RunCursor> cursors;
      for (PendingParam& part : parts) {
        out.requires_grad = out.requires_grad || part.states[key].requires_grad;
        cursors.emplace_back(part.states[key].pieces, itemsize);
      }
      for (uint64_t o = 0; o < outer; ++o) {
        if (rule.sub_widths.empty()) {
          for (size_t t = 0; t < parts.size(); ++t) cursors[t].Take(static_cast<uint64_t>(shapes[t][d]) * inner, out.pieces);
          continue;
        }
        for (const std::vector<int64_t>& widths : rule.sub_widths) {
          for (size_t t = 0; t < parts.size(); ++t) cursors[t].Take(static_cast<uint64_t>(widths[t]) * inner, out.pieces);
        }
      }
      for (const TensorPiece& p : out.pieces) out.numel += p.numel;
      merged.emplace(key, std::move(out));
    }
  }
  if (rule.vocab && !full.empty()) {
    full[0] = std::min<int64_t>(*ckpt_.info_.original_vocab_size, full[0]);
    const uint64_t keep = *ShapeNumel(full);  // no more than the checked original
    for (auto& [key, state] : merged) {
      if (state.computed) {
        state.computed = std::make_shared<const std::string>(
            state.computed->substr(0, std::min<uint64_t>(state.computed->size(), keep * format::ItemSize(state.dtype))));
        state.numel = keep;
        continue;
      }
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
  }
  e.full_shape = bare ? std::vector<int64_t>{static_cast<int64_t>(*ShapeNumel(full))} : full;
  for (const char* key : kStates) {
    PendingState& s = merged[key];
    StateTensor t;
    t.dtype = s.dtype;
    t.requires_grad = s.requires_grad;
    t.shape = e.full_shape;
    t.nbytes = s.numel * format::ItemSize(s.dtype);
    if (s.computed) {
      t.path = ckpt_.dir_ + ": '" + name + "' " + key + " (the mean of its " + std::to_string(parts.size()) +
               " TP slices, computed in memory)";
      t.computed = std::move(s.computed);
    } else if (!s.pieces.empty()) {
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

Status NativeReader::AddGroupFragments(const std::vector<RankGroup>& ranks,
                                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                                       std::map<std::string, PendingParam>& pending) const {
  if (!MappingsDisagreeWithOrder(ranks, shapes)) {
    for (const RankGroup& r : ranks) {
      for (const auto& [name, start, numel] : r.slices) {
        for (const char* key : kStates) {
          RS_RETURN_IF_ERROR(AddFragment(pending[name].states[key], r.flats.at(key), start, numel,
                                         "fragment of '" + name + "' " + key));
        }
      }
    }
    return Status::Ok();
  }
  // The flat buffer in param_shapes order, without padding (the mappings are wrong only when no
  // parameter needed alignment padding), cut at the DP ranks' partition boundaries.
  uint64_t offset = 0;  // in the group's whole flat buffer
  size_t rank = 0;
  uint64_t rank_start = 0;
  for (const auto& [name, shape] : shapes) {
    const auto numel = ShapeNumel(shape);
    if (!numel) return Corrupt(ckpt_.dir_ + ": param_shapes gives '" + name + "' too many elements");
    for (uint64_t left = *numel; left > 0;) {
      while (rank < ranks.size() && offset >= rank_start + ranks[rank].flats.at("fp32").numel()) {
        rank_start += ranks[rank].flats.at("fp32").numel();
        ++rank;
      }
      if (rank == ranks.size()) {
        return Corrupt(ckpt_.dir_ + ": the round-robin flat partitions hold fewer elements than param_shapes needs "
                       "(at '" + name + "')");
      }
      const uint64_t n = std::min(left, rank_start + ranks[rank].flats.at("fp32").numel() - offset);
      for (const char* key : kStates) {
        RS_RETURN_IF_ERROR(AddFragment(pending[name].states[key], ranks[rank].flats.at(key), offset - rank_start, n,
                                       "round-robin fragment of '" + name + "' " + key));
      }
      offset += n;
      left -= n;
    }
  }
  return Status::Ok();
}

Status NativeReader::IndexZero12(const std::vector<ucp::GroupShapes>& shapes) {
  const size_t groups = shapes[0].size();
  std::vector<std::map<std::string, PendingParam>> pending(static_cast<size_t>(tp_));  // by TP rank
  std::vector<std::optional<ucp::Step>> steps(groups);
  for (int32_t tp = 0; tp < tp_; ++tp) {
    if (shapes[static_cast<size_t>(tp)].size() != groups) {
      return Corrupt(ckpt_.dir_ + ": TP rank " + std::to_string(tp) + "'s param_shapes has " +
                     std::to_string(shapes[static_cast<size_t>(tp)].size()) + " groups, TP rank 0's " +
                     std::to_string(groups));
    }
    std::vector<std::vector<RankGroup>> ranks(groups, std::vector<RankGroup>(static_cast<size_t>(dp_)));
    for (int32_t dp = 0; dp < dp_; ++dp) {
      const TorchArchive& a = archives_[At(tp, dp)];
      const PickleTree& t = a.tree();
      const NodeId osd = OptimRoot(At(tp, dp));
      const std::vector<NodeId>* fp32 =
          format::SequenceItems(t, format::DictLookup(t, osd, "single_partition_of_fp32_groups"));
      const std::vector<NodeId>* maps = format::SequenceItems(t, format::DictLookup(t, osd, "param_slice_mappings"));
      const NodeId state = format::DictLookup(t, format::DictLookup(t, osd, "base_optimizer_state"), "state");
      if (fp32 == nullptr || maps == nullptr || format::DictItems(t, state) == nullptr) {
        return Corrupt(a.path() + ": optimizer_state_dict lacks single_partition_of_fp32_groups, "
                                  "param_slice_mappings or base_optimizer_state.state");
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
        std::map<std::string, StateTensor>& flats = ranks[g][static_cast<size_t>(dp)].flats;
        RS_ASSIGN_OR_RETURN(flats["fp32"],
                            FlatTensor(a, (*fp32)[g], "single_partition_of_fp32_groups[" + std::to_string(g) + "]"));
        for (const char* key : {"exp_avg", "exp_avg_sq"}) {
          RS_ASSIGN_OR_RETURN(flats[key], FlatTensor(a, format::DictLookup(t, gs, key), where + " " + key));
          if (flats[key].numel() != flats["fp32"].numel()) {
            return Corrupt(a.path() + ": " + where + " " + key + " has " + std::to_string(flats[key].numel()) +
                           " elements, its fp32 partition " + std::to_string(flats["fp32"].numel()));
          }
        }
        // step.pt is TP 0 / DP 0's (the converter asserts that every rank agrees; so does this).
        const NodeId step_node = format::DictLookup(t, gs, "step");
        if (step_node != kNoNode) {
          RS_ASSIGN_OR_RETURN(ucp::Step step, ucp::ParseStep(a, step_node));
          if (!steps[g]) {
            steps[g] = step;
          } else if (steps[g]->is_tensor != step.is_tensor || steps[g]->value != step.value) {
            return Corrupt(a.path() + ": " + where + " step " + std::to_string(step.value) +
                           " disagrees with rank 0's " + std::to_string(steps[g]->value));
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
          ranks[g][static_cast<size_t>(dp)].slices.emplace_back(std::string(*name), static_cast<uint64_t>(*start),
                                                                 static_cast<uint64_t>(*numel));
        }
      }
    }
    for (size_t g = 0; g < groups; ++g) {
      RS_RETURN_IF_ERROR(AddGroupFragments(ranks[g], shapes[static_cast<size_t>(tp)][g], pending[static_cast<size_t>(tp)]));
    }
  }
  std::set<std::string> listed;
  for (size_t g = 0; g < groups; ++g) {
    for (const auto& [name, shape0] : shapes[0][g]) {
      std::vector<std::vector<int64_t>> tp_shapes;
      std::vector<PendingParam> parts;
      for (int32_t tp = 0; tp < tp_; ++tp) {
        const std::vector<int64_t>* shape = ucp::FindShape(shapes[static_cast<size_t>(tp)][g], name);
        auto it = pending[static_cast<size_t>(tp)].find(name);
        if (shape == nullptr || it == pending[static_cast<size_t>(tp)].end()) {
          return Unsupported(ckpt_.dir_ + ": TP rank " + std::to_string(tp) + " holds no " +
                             (shape == nullptr ? "param_shapes entry" : "optimizer fragment") + " of '" + name +
                             "', which TP rank 0's param_shapes lists");
        }
        tp_shapes.push_back(*shape);
        parts.push_back(std::move(it->second));
        pending[static_cast<size_t>(tp)].erase(it);
      }
      RS_ASSIGN_OR_RETURN(ParamEntry e, Finish(name, static_cast<int32_t>(g), tp_shapes, std::move(parts), false));
      e.step = steps[g];
      listed.insert(name);
      ckpt_.params_.push_back(std::move(e));
    }
  }
  for (const auto& left : pending) {
    if (!left.empty()) {
      return Corrupt(ckpt_.dir_ + ": param_slice_mappings names '" + left.begin()->first +
                     "', which param_shapes does not list");
    }
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

Status NativeReader::IndexZero3(const std::vector<ucp::GroupShapes>& shapes) {
  const uint64_t world = static_cast<uint64_t>(dp_);
  const size_t subs = shapes[0].size();
  // pending[tp][sub-group][name]
  std::vector<std::vector<std::map<std::string, PendingParam>>> pending(
      static_cast<size_t>(tp_), std::vector<std::map<std::string, PendingParam>>(subs));
  for (int32_t tp = 0; tp < tp_; ++tp) {
    const ucp::GroupShapes& tp_shapes = shapes[static_cast<size_t>(tp)];
    if (tp_shapes.size() != subs) {
      return Corrupt(ckpt_.dir_ + ": TP rank " + std::to_string(tp) + "'s param_shapes has " +
                     std::to_string(tp_shapes.size()) + " sub-groups, TP rank 0's " + std::to_string(subs));
    }
    for (int32_t dp = 0; dp < dp_; ++dp) {
      const uint64_t d = static_cast<uint64_t>(dp);
      const TorchArchive& a = archives_[At(tp, dp)];
      const PickleTree& t = a.tree();
      const NodeId osd = OptimRoot(At(tp, dp));
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
      if (flats->size() != subs) {
        return Corrupt(a.path() + ": " + std::to_string(flats->size()) + " fp32_flat_groups but param_shapes has " +
                       std::to_string(subs) + " sub-groups");
      }
      for (size_t i = 0; i < subs; ++i) {
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
        for (const auto& [name, shape] : tp_shapes[i]) {
          const auto numel = ShapeNumel(shape);
          if (!numel) return Corrupt(a.path() + ": '" + name + "' has too many elements");
          const uint64_t part = (*numel + world - 1) / world;  // ceil(numel / DP): each rank's slot
          const uint64_t begin = std::min(*numel, d * part);
          const uint64_t real = std::min(part, *numel - begin);
          for (const char* key : kStates) {
            RS_RETURN_IF_ERROR(AddFragment(pending[static_cast<size_t>(tp)][i][name].states[key], flat[key], offset,
                                           real, "partition of '" + name + "' " + key));
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
  }
  for (size_t i = 0; i < subs; ++i) {
    for (const auto& [name, shape0] : shapes[0][i]) {
      std::vector<std::vector<int64_t>> tp_shapes;
      std::vector<PendingParam> parts;
      for (int32_t tp = 0; tp < tp_; ++tp) {
        const std::vector<int64_t>* shape = ucp::FindShape(shapes[static_cast<size_t>(tp)][i], name);
        if (shape == nullptr) {
          return Corrupt(ckpt_.dir_ + ": TP rank " + std::to_string(tp) + "'s param_shapes lacks '" + name +
                         "', which TP rank 0's sub-group " + std::to_string(i) + " lists");
        }
        tp_shapes.push_back(*shape);
        parts.push_back(std::move(pending[static_cast<size_t>(tp)][i][name]));
      }
      // Without TP the converter writes ZeRO-3 states as bare flat tensors; with TP it merges the
      // TP slices as for ZeRO-1/2 (dicts with their category keys).
      RS_ASSIGN_OR_RETURN(ParamEntry e,
                          Finish(name, static_cast<int32_t>(i), tp_shapes, std::move(parts), /*bare=*/tp_ == 1));
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
  std::vector<ucp::GroupShapes> shapes;  // by TP rank: its (DP 0) model-states file's param_shapes
  for (int32_t tp = 0; tp < r.tp_; ++tp) {
    const TorchArchive& m = ckpt.ModelStatesForTp(tp)->archive;  // the grid was checked by LoadModelStates
    auto parsed = ucp::ParseParamShapes(m.tree(), format::DictLookup(m.tree(), m.tree().root(), "param_shapes"));
    if (!parsed.ok()) return parsed.status().Annotate(m.path());
    shapes.push_back(std::move(parsed).value());
  }
  ckpt.num_source_groups_ = static_cast<int32_t>(shapes[0].size());
  RS_RETURN_IF_ERROR(ckpt.CheckParamGroups());
  if (ckpt.zero_stage_ == 3) {
    RS_RETURN_IF_ERROR(r.IndexZero3(shapes));
  } else {
    RS_RETURN_IF_ERROR(r.IndexZero12(shapes));
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
