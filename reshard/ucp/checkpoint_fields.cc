#include "reshard/ucp/checkpoint_fields.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "reshard/base/checked_math.h"
#include "reshard/format/pickle_query.h"

namespace reshard::ucp {

using format::DescribeNode;
using format::kNoNode;
using format::NodeId;
using format::PickleTree;

bool IsDir(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec);
}

bool IsFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
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

std::optional<RankFileName> ParseRankFileName(std::string_view name, std::string_view suffix) {
  if (name.size() <= suffix.size() || name.substr(name.size() - suffix.size()) != suffix) return std::nullopt;
  name.remove_suffix(suffix.size());
  RankFileName r;
  constexpr std::string_view kMp = "mp_rank_", kZero = "zero_pp_rank_", kBf16 = "bf16_";
  if (name.substr(0, kBf16.size()) == kBf16) name.remove_prefix(kBf16.size());
  if (name.substr(0, kZero.size()) == kZero) {
    name.remove_prefix(kZero.size());
    const size_t sep = name.find('_');
    if (sep == std::string_view::npos) return std::nullopt;
    const auto dp = ParseRank(name.substr(0, sep));
    name.remove_prefix(sep + 1);
    if (!dp || name.substr(0, kMp.size()) != kMp) return std::nullopt;
    r.zero3 = true;
    r.dp = *dp;
  } else if (name.substr(0, kMp.size()) != kMp) {
    return std::nullopt;
  }
  name.remove_prefix(kMp.size());
  const auto tp = ParseRank(name);
  if (!tp) return std::nullopt;
  r.tp = *tp;
  return r;
}

std::optional<uint64_t> ShapeNumel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    const auto m = CheckedMul(n, static_cast<uint64_t>(d));
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

Result<std::string> FollowTagFile(const std::string& parent, std::string_view name) {
  const std::string file = parent + "/" + std::string(name);
  std::ifstream in(file, std::ios::binary);
  constexpr size_t kMaxTagBytes = 4096;  // a folder name; anything longer is not a tag
  std::string content(kMaxTagBytes + 1, '\0');
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  if (!in.is_open() || in.bad()) return IoError(file + ": read failed");
  content.resize(static_cast<size_t>(in.gcount()));
  if (content.size() > kMaxTagBytes) return Corrupt(file + ": longer than " + std::to_string(kMaxTagBytes) + " bytes");
  // The engine joins the stripped text to the folder (engine.py load_checkpoint), so a tag
  // with a '/' is a sub-path there and here alike.
  const std::string tag = StripWhitespace(content);
  if (tag.empty()) return NotFound(file + ": empty, names no checkpoint folder");
  const std::string dir = StripTrailingSlashes(parent + "/" + tag);
  if (!IsDir(dir)) return NotFound(file + ": names '" + tag + "', but " + dir + " is not a folder");
  return dir;
}

// Python's str.strip(): the whitespace DeepSpeed's `fd.read().strip()` removes.
std::string StripWhitespace(const std::string& s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// zero_stage: a plain int, or deepspeed.runtime.zero.config.ZeroStageEnum by value or by name.
// Python 3.11+ may pickle the enum by name, older Pythons (and 0.19.8's files) by value;
// both mean the same stage. An unknown member name is refused rather than guessed.
Result<std::optional<int32_t>> ParseZeroStage(const PickleTree& tree, NodeId value) {
  if (value == kNoNode) return std::optional<int32_t>();
  std::optional<int64_t> stage = format::AsInt(tree, value);
  if (!stage) {
    const auto member = format::AsEnumMember(tree, value, "deepspeed.runtime.zero.config", "ZeroStageEnum");
    if (member && member->value) {
      stage = member->value;
    } else if (member) {
      static const std::map<std::string, int64_t> kByName = {
          {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
      const auto it = kByName.find(member->name);
      if (it == kByName.end())
        return Corrupt("'zero_stage' names an unknown ZeroStageEnum member '" + member->name + "'");
      stage = it->second;
    }
  }
  if (!stage || *stage < 0 || *stage > 3) {
    return Corrupt("'zero_stage' must be 0-3 or a ZeroStageEnum, got " + DescribeNode(tree, value));
  }
  return std::optional<int32_t>(static_cast<int32_t>(*stage));
}

// Both universal loaders restore hyper-parameters from these groups, so they are required; the
// groups themselves stay inert nodes for the planner to re-emit.
Result<std::vector<ParamGroup>> ParseParamGroups(const PickleTree& tree, NodeId value) {
  const std::vector<NodeId>* groups = format::SequenceItems(tree, value);
  if (groups == nullptr) return Corrupt("'param_groups' must be a list, got " + DescribeNode(tree, value));
  std::vector<ParamGroup> out;
  for (NodeId g : *groups) {
    const std::string where = "param_groups[" + std::to_string(out.size()) + "]";
    if (format::DictItems(tree, g) == nullptr) return Corrupt(where + " must be a dict, got " + DescribeNode(tree, g));
    auto params = format::AsIntSequence(tree, format::DictLookup(tree, g, "params"));
    if (!params) return Corrupt(where + " has no 'params' list of int");
    out.push_back(ParamGroup{g, std::move(*params)});
  }
  return out;
}

Result<GroupShapes> ParseParamShapes(const PickleTree& tree, NodeId value) {
  const std::vector<NodeId>* groups = format::SequenceItems(tree, value);
  if (groups == nullptr) return Corrupt("'param_shapes' must be a list, got " + DescribeNode(tree, value));
  GroupShapes out;
  for (NodeId g : *groups) {
    const std::vector<NodeId>* items = format::DictItems(tree, g);
    if (items == nullptr) return Corrupt("'param_shapes' entries must be dicts, got " + DescribeNode(tree, g));
    auto& group = out.emplace_back();
    for (size_t k = 0; k + 1 < items->size(); k += 2) {
      const auto name = format::AsStr(tree, (*items)[k]);
      if (!name) return Corrupt("'param_shapes' has a non-str name: " + DescribeNode(tree, (*items)[k]));
      // DeepSpeed stores torch.Size; a plain tuple or list of ints is the same shape.
      auto shape = format::AsTorchSize(tree, (*items)[k + 1]);
      if (!shape) shape = format::AsIntSequence(tree, (*items)[k + 1]);
      if (!shape || std::any_of(shape->begin(), shape->end(), [](int64_t d) { return d < 0; })) {
        return Corrupt("'param_shapes' entry '" + std::string(*name) +
                       "' is not a shape: " + DescribeNode(tree, (*items)[k + 1]));
      }
      group.emplace_back(std::string(*name), std::move(*shape));
    }
  }
  return out;
}

const std::vector<int64_t>* FindShape(const GroupShapes::value_type& group, const std::string& name) {
  const auto it = std::find_if(group.begin(), group.end(), [&](const auto& entry) { return entry.first == name; });
  return it == group.end() ? nullptr : &it->second;
}

}  // namespace reshard::ucp
