#include "reshard/plan/target_config.h"

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string_view>

#include "reshard/base/checked_math.h"
#include "reshard/format/pickle_query.h"
#include "reshard/layout/autotp_rules.h"

namespace reshard::plan {
namespace {

using Path = std::initializer_list<std::string_view>;

bool IsAuto(const nlohmann::ordered_json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

std::string Dotted(Path path) {
  std::string out;
  for (std::string_view p : path) out += (out.empty() ? "" : ".") + std::string(p);
  return out;
}

// `d` as an int64 when it is a whole number in range (casting any other double is undefined behaviour).
std::optional<int64_t> IntegralDouble(double d) {
  constexpr double kTwo63 = 9223372036854775808.0;
  if (!(d >= -kTwo63 && d < kTwo63) || d != std::trunc(d)) return std::nullopt;
  return static_cast<int64_t>(d);
}

// `value` of the config key `key` as an int: layout degrees and stages are ints downstream.
Result<int> NarrowToInt(int64_t value, std::string_view key) {
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    return InvalidArgument(std::string(key) + " " + std::to_string(value) + " is out of range");
  }
  return static_cast<int>(value);
}

// A ds_config as a JSON document (the target's) or as the pickled dict the source run saved.
class ConfigView {
 public:
  explicit ConfigView(const nlohmann::ordered_json* json, std::string name) : json_(json), name_(std::move(name)) {}
  ConfigView(const format::PickleTree* tree, format::NodeId root, std::string name)
      : tree_(tree), root_(root), name_(std::move(name)) {}

  Result<std::optional<int64_t>> Int(Path path) const {
    if (json_ != nullptr) {
      const nlohmann::ordered_json* v = Find(path);
      if (v == nullptr || v->is_null() || IsAuto(*v)) return std::optional<int64_t>();
      if (v->is_number_integer()) return std::optional<int64_t>(v->get<int64_t>());
      if (v->is_number_float()) {  // 1e9 in JSON is a float
        if (auto i = IntegralDouble(v->get<double>())) return std::optional<int64_t>(*i);
      }
      return Bad(path, "an integer");
    }
    const format::NodeId v = FindNode(path);
    if (v == format::kNoNode || format::IsNone(*tree_, v)) return std::optional<int64_t>();
    if (auto i = format::AsInt(*tree_, v)) return std::optional<int64_t>(*i);
    if (auto f = format::AsFloat(*tree_, v)) {
      if (auto i = IntegralDouble(*f)) return std::optional<int64_t>(*i);
    }
    return Bad(path, "an integer");
  }

  Result<std::optional<bool>> Bool(Path path) const {
    if (json_ != nullptr) {
      const nlohmann::ordered_json* v = Find(path);
      if (v == nullptr || v->is_null()) return std::optional<bool>();
      if (v->is_boolean()) return std::optional<bool>(v->get<bool>());
      if (IsAuto(*v)) return std::optional<bool>();
      return Bad(path, "true or false");
    }
    const format::NodeId v = FindNode(path);
    if (v == format::kNoNode || format::IsNone(*tree_, v)) return std::optional<bool>();
    if (auto b = format::AsBool(*tree_, v)) return std::optional<bool>(*b);
    return Bad(path, "true or false");
  }

  // True when the JSON config holds "auto" at `path`: a value the HF Trainer fills in from its own
  // arguments when it starts, which a config read before then cannot know (read as unset).
  bool Auto(Path path) const {
    if (json_ == nullptr) return false;
    const nlohmann::ordered_json* v = Find(path);
    return v != nullptr && IsAuto(*v);
  }

  Result<std::optional<std::string>> Str(Path path) const {
    if (json_ != nullptr) {
      const nlohmann::ordered_json* v = Find(path);
      if (v == nullptr || v->is_null()) return std::optional<std::string>();
      if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
      return Bad(path, "a string");
    }
    const format::NodeId v = FindNode(path);
    if (v == format::kNoNode || format::IsNone(*tree_, v)) return std::optional<std::string>();
    if (auto s = format::AsStr(*tree_, v)) return std::optional<std::string>(std::string(*s));
    return Bad(path, "a string");
  }

 private:
  const nlohmann::ordered_json* Find(Path path) const {
    const nlohmann::ordered_json* v = json_;
    for (std::string_view key : path) {
      if (!v->is_object()) return nullptr;
      const auto it = v->find(std::string(key));
      if (it == v->end()) return nullptr;
      v = &*it;
    }
    return v;
  }

  format::NodeId FindNode(Path path) const {
    format::NodeId v = root_;
    for (std::string_view key : path) v = format::DictLookup(*tree_, v, key);
    return v;
  }

  Status Bad(Path path, const char* want) const {
    return InvalidArgument(name_ + ": " + Dotted(path) + " must be " + want);
  }

  const nlohmann::ordered_json* json_ = nullptr;
  const format::PickleTree* tree_ = nullptr;
  format::NodeId root_ = format::kNoNode;
  std::string name_;
};

// The first value any view has for `path`, by precedence.
template <typename T, typename Get>
Result<std::optional<T>> First(const std::vector<const ConfigView*>& views, Get get) {
  for (const ConfigView* v : views) {
    RS_ASSIGN_OR_RETURN(std::optional<T> value, get(*v));
    if (value) return value;
  }
  return std::optional<T>();
}

Result<std::optional<format::DType>> LpFrom(const ConfigView& v) {
  RS_ASSIGN_OR_RETURN(std::optional<bool> bf16, v.Bool({"bf16", "enabled"}));
  if (!bf16) {
    RS_ASSIGN_OR_RETURN(bf16, v.Bool({"bfloat16", "enabled"}));
  }
  RS_ASSIGN_OR_RETURN(std::optional<bool> fp16, v.Bool({"fp16", "enabled"}));
  if (bf16.value_or(false) && fp16.value_or(false)) {
    return InvalidArgument("bf16.enabled and fp16.enabled are both true");
  }
  if (bf16.value_or(false)) return std::optional<format::DType>(format::DType::kBFloat16);
  if (fp16.value_or(false)) return std::optional<format::DType>(format::DType::kFloat16);
  if (bf16 || fp16) return std::optional<format::DType>(format::DType::kFloat32);  // said, and off
  return std::optional<format::DType>();
}

Result<std::optional<int64_t>> DpFrom(const ConfigView& v, std::string_view name) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> batch, v.Int({"train_batch_size"}));
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> micro, v.Int({"train_micro_batch_size_per_gpu"}));
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> accum, v.Int({"gradient_accumulation_steps"}));
  if (!batch || !micro || !accum) return std::optional<int64_t>();
  // Unsigned, checked: both are at least 1 there, and the product of two config values may overflow.
  const std::optional<uint64_t> per_rank =
      *micro < 1 || *accum < 1 ? std::nullopt
                               : CheckedMul(static_cast<uint64_t>(*micro), static_cast<uint64_t>(*accum));
  if (!per_rank || *per_rank > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      *batch % static_cast<int64_t>(*per_rank) != 0) {
    return InvalidArgument(std::string(name) + ": train_batch_size " + std::to_string(*batch) +
                           " is not a multiple of train_micro_batch_size_per_gpu * gradient_accumulation_steps (" +
                           std::to_string(*micro) + " * " + std::to_string(*accum) + ")");
  }
  return std::optional<int64_t>(*batch / static_cast<int64_t>(*per_rank));
}

}  // namespace

std::optional<format::DType> ParseLpDtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return format::DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return format::DType::kBFloat16;
  if (name == "fp16" || name == "float16" || name == "half") return format::DType::kFloat16;
  return std::nullopt;
}

Result<ModelConfig> ParseModelConfig(const nlohmann::ordered_json& config) {
  const ConfigView view(&config, "the model config");
  ModelConfig out;
  RS_ASSIGN_OR_RETURN(std::optional<std::string> type, view.Str({"model_type"}));
  out.model_type = type.value_or("");
  // save_pretrained leaves out what equals the config class's defaults: a listed family's fill the gaps.
  const std::optional<layout::ModelConfigDefaults> defaults = layout::BuiltinModelConfigDefaults(out.model_type);
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> heads, view.Int({"num_attention_heads"}));
  if (!heads && defaults) heads = defaults->num_attention_heads;
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> kv, view.Int({"num_key_value_heads"}));
  if (!kv && defaults) kv = defaults->num_key_value_heads;
  if (!kv) kv = heads;
  if (kv && *kv < 1) return InvalidArgument("the model config: num_key_value_heads must be at least 1");
  out.num_kv_heads = kv;
  RS_ASSIGN_OR_RETURN(std::optional<bool> tied, view.Bool({"tie_word_embeddings"}));
  out.tie_word_embeddings = tied.value_or(defaults && defaults->tie_word_embeddings);
  return out;
}

Result<Target> ResolveTarget(const ucp::UniversalCheckpoint& ckpt, const nlohmann::ordered_json& ds_config,
                             const TargetOverrides& o, const ModelConfig& model) {
  const format::TorchArchive& ms = ckpt.model_states().front().archive;
  const format::NodeId src_root = format::DictLookup(ms.tree(), ms.tree().root(), "ds_config");
  const ConfigView source(&ms.tree(), src_root, ms.path() + ": ds_config");
  const ConfigView target(&ds_config, "the target ds_config");
  std::vector<const ConfigView*> views;
  if (!ds_config.is_null()) views.push_back(&target);
  views.push_back(&source);
  const std::vector<const ConfigView*> target_only(views.begin(), views.end() - 1);

  Target t;
  RS_ASSIGN_OR_RETURN(auto stage, First<int64_t>(views, [](const ConfigView& v) {
                        return v.Int({"zero_optimization", "stage"});
                      }));
  RS_ASSIGN_OR_RETURN(const int config_stage, NarrowToInt(stage.value_or(ckpt.zero_stage()), "zero_optimization.stage"));
  t.zero_stage = o.zero_stage ? *o.zero_stage : config_stage;
  RS_ASSIGN_OR_RETURN(auto tp, First<int64_t>(target_only, [](const ConfigView& v) {
                        return v.Int({"tensor_parallel", "autotp_size"});
                      }));
  RS_ASSIGN_OR_RETURN(const int config_tp, NarrowToInt(tp.value_or(ckpt.tp_degree()), "tensor_parallel.autotp_size"));
  t.tp_size = o.tp_size ? *o.tp_size : config_tp;
  std::optional<int64_t> dp;
  if (!ds_config.is_null()) {
    RS_ASSIGN_OR_RETURN(dp, DpFrom(target, "the target ds_config"));
    // The source's DP would be a guess: "auto" batch sizes are the Trainer's, from a world size not known here.
    for (const char* key : {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"}) {
      if (!dp && !o.dp_size && target.Auto({key})) {
        return InvalidArgument(std::string("the target ds_config's ") + key +
                               " is \"auto\" (the HF Trainer fills it in when it starts), so it gives no DP size: "
                               "pass --dp");
      }
    }
    if (dp && tp && *tp > 1) {
      if (*dp % *tp != 0) {
        return InvalidArgument("the target ds_config's batch sizes give " + std::to_string(*dp) +
                               " ranks, not a multiple of tensor_parallel.autotp_size " + std::to_string(*tp));
      }
      *dp /= *tp;
    }
  }
  RS_ASSIGN_OR_RETURN(const int config_dp, NarrowToInt(dp.value_or(ckpt.dp_world_size()), "the target DP size"));
  t.dp_size = o.dp_size ? *o.dp_size : config_dp;
  RS_ASSIGN_OR_RETURN(auto lp, First<format::DType>(views, LpFrom));
  t.lp_dtype = o.lp_dtype ? *o.lp_dtype : lp.value_or(format::DType::kFloat32);
  RS_ASSIGN_OR_RETURN(auto rr, First<bool>(views, [](const ConfigView& v) {
                        return v.Bool({"zero_optimization", "round_robin_gradients"});
                      }));
  t.round_robin_gradients = rr.value_or(false);
  RS_ASSIGN_OR_RETURN(auto sub, First<int64_t>(views, [](const ConfigView& v) {
                        return v.Int({"zero_optimization", "sub_group_size"});
                      }));
  if (sub && *sub < 1) return InvalidArgument("zero_optimization.sub_group_size must be at least 1");
  if (sub) t.sub_group_size = static_cast<uint64_t>(*sub);
  RS_ASSIGN_OR_RETURN(auto accum, First<std::string>(views, [](const ConfigView& v) {
                        return v.Str({"data_types", "grad_accum_dtype"});
                      }));
  RS_ASSIGN_OR_RETURN(auto offload, First<std::string>(views, [](const ConfigView& v) {
                        return v.Str({"zero_optimization", "offload_optimizer", "device"});
                      }));
  // engine.py _do_optimizer_sanity_check: the one combination that selects BF16_Optimizer.
  t.bf16_optimizer = t.lp_dtype == format::DType::kBFloat16 && t.zero_stage == 1 && accum &&
                     (*accum == "fp32" || *accum == "float32") && (!offload || *offload == "none");
  RS_ASSIGN_OR_RETURN(auto grain, First<int64_t>(target_only, [](const ConfigView& v) {
                        return v.Int({"tensor_parallel", "tp_grain_size"});
                      }));
  if (grain && *grain < 1) return InvalidArgument("tensor_parallel.tp_grain_size must be at least 1");
  t.tp_grain_size = grain.value_or(1);
  t.num_kv_heads = model.num_kv_heads;
  t.model_type = model.model_type;
  t.tied_word_embeddings = model.tie_word_embeddings;
  t.autotp = tp && *tp > 1;
  t.padded_vocab_rows = o.padded_vocab_rows;
  t.tag = o.tag;
  t.weights_dtype = o.weights_dtype;
  t.ds_config = ds_config;
  return t;
}

}  // namespace reshard::plan
