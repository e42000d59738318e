#include "reshard/ucp/param_state.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>
#include <string_view>
#include <tuple>

#include "reshard/base/checked_math.h"
#include "reshard/base/folder_entries.h"
#include "reshard/base/mapped_file.h"
#include "reshard/base/unique_fd.h"
#include "reshard/format/pickle_query.h"
#include "reshard/format/torch_archive.h"
#include "reshard/format/torch_tensor.h"

namespace reshard::ucp {
namespace {

using format::DescribeNode;
using format::NodeId;
using format::PickleTree;
using format::TorchArchive;

constexpr std::string_view kStepKey = "step";
constexpr std::string_view kFp32Key = "fp32";

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t k = 0; k < shape.size(); ++k) s += (k ? ", " : "") + std::to_string(shape[k]);
  return s + "]";
}

// The dtypes DeepSpeed keeps masters and moments in (bf16/fp16 with *_master_weights or
// bf16_optimizer_states). Integer or fp8 "states" would be a different optimizer or a broken
// file; either way the planner's fp32 -> lp conversions would not apply.
bool IsFloatingDType(format::DType dtype) {
  using format::DType;
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16 || dtype == DType::kFloat64;
}

// What one state file holds, before the states of a folder are compared.
struct StateFile {
  bool bare = false;
  StateTensor tensor;
  ParamCategories categories;
};

Result<int64_t> CategoryInt(const PickleTree& tree, NodeId id, std::string_view key, int64_t min) {
  const auto v = format::AsInt(tree, id);
  if (!v || *v < min) {
    return Corrupt("'" + std::string(key) + "' must be an int >= " + std::to_string(min) + ", got " +
                   DescribeNode(tree, id));
  }
  return *v;
}

Result<bool> CategoryBool(const PickleTree& tree, NodeId id, std::string_view key) {
  const auto v = format::AsBool(tree, id);
  if (!v) return Corrupt("'" + std::string(key) + "' must be a bool, got " + DescribeNode(tree, id));
  return *v;
}

// The dict form: 'param' plus the category keys merge_tp_slices and the AutoEP consolidation
// write. Types are checked strictly (cat_dim True is refused, not read as 1) because the
// loader's behaviour for other types is whatever Python happens to do with them.
Result<StateFile> ParseStateDict(const TorchArchive& archive, NodeId root) {
  const PickleTree& tree = archive.tree();
  const std::vector<NodeId>* items = format::DictItems(tree, root);
  if (items == nullptr) {
    return Corrupt("expected a dict with 'param' or a bare tensor, got " + DescribeNode(tree, root));
  }
  StateFile out;
  bool have_param = false;
  for (size_t k = 0; k + 1 < items->size(); k += 2) {
    const auto key_text = format::AsStr(tree, (*items)[k]);
    if (!key_text) return Corrupt("state dict has a non-str key: " + DescribeNode(tree, (*items)[k]));
    const std::string key(*key_text);
    const NodeId value = (*items)[k + 1];
    ParamCategories& c = out.categories;
    if (key == "param") {
      RS_ASSIGN_OR_RETURN(auto tensor, format::MatchTensor(tree, value));
      if (!tensor) return Corrupt("'param' must be a tensor, got " + DescribeNode(tree, value));
      RS_ASSIGN_OR_RETURN(out.tensor, LocateTensor(archive, *tensor));
      have_param = true;
    } else if (key == "cat_dim") {
      RS_ASSIGN_OR_RETURN(c.cat_dim, CategoryInt(tree, value, key, 0));
    } else if (key == "param_n_sub_params") {
      RS_ASSIGN_OR_RETURN(c.param_n_sub_params, CategoryInt(tree, value, key, 1));
    } else if (key == "ep_num_experts") {
      RS_ASSIGN_OR_RETURN(c.ep_num_experts, CategoryInt(tree, value, key, 1));
    } else if (key == "vocab_tensor") {
      RS_ASSIGN_OR_RETURN(c.vocab_tensor, CategoryBool(tree, value, key));
    } else if (key == "is_expert_param") {
      RS_ASSIGN_OR_RETURN(c.is_expert_param, CategoryBool(tree, value, key));
    } else if (key == "sub_param_shape") {
      auto shape = ParseSubparamShapeObject(tree, value);
      if (!shape.ok()) return shape.status().Annotate("'sub_param_shape'");
      c.sub_param_shape = std::move(shape).value();
    } else if (key == "folding") {
      return Unsupported("unsupported key 'folding' (AutoEP + AutoTP folding metadata) in the state dict");
    } else {
      return Unsupported("unknown key '" + key +
                         "' in the state dict (known: param, cat_dim, param_n_sub_params, sub_param_shape, "
                         "vocab_tensor, is_expert_param, ep_num_experts)");
    }
  }
  if (!have_param) return Corrupt("state dict has no 'param' tensor");
  const auto& cat_dim = out.categories.cat_dim;
  if (cat_dim && static_cast<uint64_t>(*cat_dim) >= out.tensor.shape.size()) {
    return Corrupt("'cat_dim' " + std::to_string(*cat_dim) + " is outside the " +
                   std::to_string(out.tensor.shape.size()) + "-dimensional param");
  }
  return out;
}

// A state file holds a bare tensor (ZeRO-3, TP=1) or a dict; MatchTensor decides which.
// `name` is opened inside the folder open as `dir_fd`; `path` names it.
Result<StateFile> ParseStateFile(int dir_fd, const std::string& name, const std::string& path) {
  RS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::OpenAt(dir_fd, name, path));
  RS_ASSIGN_OR_RETURN(TorchArchive archive, TorchArchive::FromFile(std::move(file)));
  const NodeId root = archive.tree().root();
  auto parse = [&]() -> Result<StateFile> {
    RS_ASSIGN_OR_RETURN(auto tensor, format::MatchTensor(archive.tree(), root));
    if (!tensor) return ParseStateDict(archive, root);
    StateFile out;
    out.bare = true;
    RS_ASSIGN_OR_RETURN(out.tensor, LocateTensor(archive, *tensor));
    return out;
  };
  auto parsed = parse();
  if (!parsed.ok()) return parsed.status().Annotate(path);
  return parsed;
}

// step.pt is saved as-is from the optimizer state: never a dict, so it has its own parser.
Result<Step> ParseStepFile(int dir_fd, const std::string& name, const std::string& path) {
  RS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::OpenAt(dir_fd, name, path));
  RS_ASSIGN_OR_RETURN(TorchArchive archive, TorchArchive::FromFile(std::move(file)));
  return ParseStep(archive, archive.tree().root());
}

// For the disagreement message only: names the keys that differ without dumping the spec.
std::string CategoriesString(const ParamCategories& c) {
  std::string s;
  auto add = [&](std::string_view key, const std::string& value) {
    s += (s.empty() ? "" : ", ") + std::string(key) + "=" + value;
  };
  if (c.cat_dim) add("cat_dim", std::to_string(*c.cat_dim));
  if (c.param_n_sub_params) add("param_n_sub_params", std::to_string(*c.param_n_sub_params));
  if (c.sub_param_shape) add("sub_param_shape", "(" + std::to_string(c.sub_param_shape->shape.size()) + "-d spec)");
  if (c.vocab_tensor) add("vocab_tensor", *c.vocab_tensor ? "True" : "False");
  if (c.is_expert_param) add("is_expert_param", *c.is_expert_param ? "True" : "False");
  if (c.ep_num_experts) add("ep_num_experts", std::to_string(*c.ep_num_experts));
  return "{" + s + "}";
}

// The states of one parameter must describe one tensor: same format, same shape, same
// category keys. (dtypes may differ: bf16 optimizer states next to an fp32 master is legal.)
Status CheckAgrees(const std::string& dir, const std::string& key, const StateFile& f, const StateFile& fp32) {
  const std::string file = dir + "/" + key + ".pt";
  if (f.bare != fp32.bare) {
    return Corrupt(file + ": is " + (f.bare ? "a bare tensor" : "a dict") + " but fp32.pt is " +
                   (fp32.bare ? "a bare tensor" : "a dict"));
  }
  if (f.tensor.shape != fp32.tensor.shape) {
    return Corrupt(file + ": shape " + ShapeString(f.tensor.shape) + " differs from fp32.pt's " +
                   ShapeString(fp32.tensor.shape));
  }
  if (f.categories != fp32.categories) {
    return Corrupt(file + ": category keys " + CategoriesString(f.categories) + " differ from fp32.pt's " +
                   CategoriesString(fp32.categories));
  }
  return Status::Ok();
}

}  // namespace

Result<Step> ParseStep(const TorchArchive& archive, NodeId root) {
  const std::string& path = archive.path();
  const PickleTree& tree = archive.tree();
  Step step;
  if (const auto i = format::AsInt(tree, root)) {
    step.int_value = *i;
    step.value = static_cast<double>(*i);
    return step;
  }
  auto tensor = format::MatchTensor(tree, root);
  if (!tensor.ok()) return tensor.status().Annotate(path);
  const bool scalar_float =
      *tensor && (*tensor)->shape.empty() &&
      ((*tensor)->dtype == format::DType::kFloat32 || (*tensor)->dtype == format::DType::kFloat64);
  if (!scalar_float) {
    return Unsupported(path + ": step must be an int or a 0-d float32/float64 tensor, got " +
                       (*tensor ? "a tensor of shape " + ShapeString((*tensor)->shape) + " and dtype " +
                                      std::string(format::TorchName((*tensor)->dtype))
                                : DescribeNode(tree, root)));
  }
  auto located = LocateTensor(archive, **tensor);
  if (!located.ok()) return located.status().Annotate(path);
  step.is_tensor = true;
  step.tensor = std::move(located).value();
  // The one place tensor bytes are read at mount: the step is a value the planner re-emits.
  const uint8_t* bytes = archive.file().data() + step.tensor.data_offset;
  if (step.tensor.dtype == format::DType::kFloat32) {
    float f;
    std::memcpy(&f, bytes, sizeof(f));
    step.value = f;
  } else {
    std::memcpy(&step.value, bytes, sizeof(step.value));
  }
  return step;
}

// The archive already checked that the view fits its storage and that the storage record holds exactly
// the storage's bytes; the offset is recomputed with checked arithmetic all the same, because it leaves
// as a plain number that readers will pread() with.
Result<StateTensor> LocateTensor(const TorchArchive& archive, const format::TensorRef& t) {
  if (!t.is_contiguous()) {
    return Unsupported("tensor of shape " + ShapeString(t.shape) + " has strides " + ShapeString(t.stride) +
                       ", not contiguous (DeepSpeed writes contiguous tensors; reshardfs does not serve views)");
  }
  if (!IsFloatingDType(t.dtype)) {
    return Unsupported("tensor dtype " + std::string(format::TorchName(t.dtype)) +
                       " (expected float32, bfloat16, float16 or float64)");
  }
  const auto storage = archive.storages().find(t.storage.key);
  if (storage == archive.storages().end()) {
    return Internal("tensor storage '" + t.storage.key + "' missing from the archive index");
  }
  const uint64_t itemsize = format::ItemSize(t.dtype);
  // A contiguous view may start inside its storage: ds_to_universal saves `tensor.float()` of a
  // module entry, which for an fp32 run is the entry itself, a view into ZeRO's flat buffer.
  const auto skip = CheckedMul(static_cast<uint64_t>(t.storage_offset), itemsize);
  const auto offset = skip ? CheckedAdd(storage->second.data_offset, *skip) : std::nullopt;
  const auto nbytes = CheckedMul(t.numel(), itemsize);
  if (!offset || !nbytes || !RangeFits(*offset, *nbytes, archive.file().size())) {
    return Corrupt("tensor at storage offset " + std::to_string(t.storage_offset) + " of storage '" + t.storage.key +
                   "' reaches past the end of the file");
  }
  StateTensor out;
  out.path = archive.path();
  out.data_offset = *offset;
  out.dtype = t.dtype;
  out.shape = t.shape;
  out.nbytes = *nbytes;
  out.requires_grad = t.requires_grad;
  return out;
}


uint64_t StateTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::optional<std::string> DeepSpeedStateKey(const std::string& entry_name) {
  // re.search(r'(.+).pt'): leftmost start, then the longest group; '.' never matches '\n'.
  const size_t n = entry_name.size();
  for (size_t start = 0; start < n; ++start) {
    size_t line_end = entry_name.find('\n', start);
    if (line_end == std::string::npos) line_end = n;
    // The group is [start, j) with j > start; then one character at j and "pt" at j + 1,
    // all before the next newline.
    for (size_t j = line_end >= 3 ? line_end - 3 : 0; j > start; --j) {
      if (entry_name.compare(j + 1, 2, "pt") == 0) return entry_name.substr(start, j - start);
    }
  }
  return std::nullopt;
}

Result<ParamEntry> IndexParamFolder(const std::string& dir, const std::string& name) {
  const UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return NotFound(dir + ": cannot list the parameter folder: " + std::strerror(errno));
  return IndexParamFolder(dir_fd.get(), dir, name);
}

Result<ParamEntry> IndexParamFolder(int dir_fd, const std::string& dir, const std::string& name) {
  auto listed = ListFolder(dir_fd, dir);
  if (!listed.ok()) return listed.status();  // opened but not listable: kIoError "<dir>: cannot list: <reason>"
  std::vector<FolderEntry>& entries = *listed;
  // Directory order is arbitrary; sorting keeps the index (and its first error) deterministic.
  std::sort(entries.begin(), entries.end(),
            [](const FolderEntry& a, const FolderEntry& b) { return std::tie(a.name, a.regular) < std::tie(b.name, b.regular); });
  // DeepSpeed opens "<key>.pt" by name, so only regular files count as existing states.
  std::set<std::string> names;
  for (const FolderEntry& e : entries) {
    if (e.regular) names.insert(e.name);
  }

  std::map<std::string, std::string> state_files;  // key -> file name, step included
  for (const FolderEntry& e : entries) {
    const auto key = DeepSpeedStateKey(e.name);
    if (!key) continue;  // DeepSpeed's loader ignores it too
    if (e.regular && e.name == *key + ".pt") {
      state_files.emplace(*key, e.name);
    } else if (!e.regular || names.count(*key + ".pt") == 0) {
      return Corrupt(dir + "/" + e.name + ": DeepSpeed's universal loader takes this entry for the state '" + *key +
                     "' and would fail to load '" + *key + ".pt' (rename or remove it)");
    }
  }
  if (state_files.count(std::string(kFp32Key)) == 0) {
    return NotFound(dir + ": no fp32.pt (every parameter folder needs its fp32 master weight)");
  }

  ParamEntry out;
  out.name = name;
  out.dir = dir;
  // fp32.pt is the reference the other states are compared with (it is the one every loader
  // reads, and the one the converter also writes for module entries without optimizer state).
  const std::string fp32_file = state_files.at(std::string(kFp32Key));
  RS_ASSIGN_OR_RETURN(const StateFile fp32, ParseStateFile(dir_fd, fp32_file, dir + "/" + fp32_file));
  for (const auto& [key, file] : state_files) {
    const std::string path = dir + "/" + file;
    if (key == kStepKey) {
      RS_ASSIGN_OR_RETURN(out.step, ParseStepFile(dir_fd, file, path));
      continue;
    }
    if (key == kFp32Key) {
      out.states.emplace(key, fp32.tensor);
      continue;
    }
    RS_ASSIGN_OR_RETURN(const StateFile f, ParseStateFile(dir_fd, file, path));
    RS_RETURN_IF_ERROR(CheckAgrees(dir, key, f, fp32));
    out.states.emplace(key, f.tensor);
  }
  out.full_shape = fp32.tensor.shape;
  out.bare_tensor = fp32.bare;
  out.categories = fp32.categories;
  return out;
}

}  // namespace reshard::ucp
