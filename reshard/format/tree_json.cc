#include "reshard/format/tree_json.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <vector>

#include "reshard/format/torch_tensor.h"

namespace reshard::format {
namespace {

using Json = nlohmann::ordered_json;

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

class Encoder {
 public:
  Encoder(const PickleTree& tree, const TreeJsonLimits& limits)
      : tree_(tree), limits_(limits), on_path_(tree.size(), false) {}

  Result<Json> Encode(NodeId id, uint32_t depth) {
    if (!tree_.valid(id)) return Internal("pickle tree refers to a missing node");
    if (depth > limits_.max_depth) {
      return ResourceExhausted("nesting deeper than " + std::to_string(limits_.max_depth));
    }
    if (++emitted_ > limits_.max_nodes) {
      return ResourceExhausted("more than " + std::to_string(limits_.max_nodes) + " nodes to print");
    }
    const Node& n = tree_.node(id);
    const bool hex = n.kind == NodeKind::kBytes || n.kind == NodeKind::kByteArray;
    const uint64_t text = hex ? 2 * n.text.size() : n.text.size() + n.global_name().size();
    spent_ += kBytesPerNode + text;
    if (spent_ > limits_.max_bytes) {
      return ResourceExhausted("more than " + std::to_string(limits_.max_bytes) +
                               " bytes to print (shared values are printed at each reference)");
    }
    if (on_path_[id]) return Unsupported("the pickle contains a cycle");
    on_path_[id] = true;
    Result<Json> out = EncodeNode(id, depth);
    on_path_[id] = false;
    return out;
  }

 private:
  Result<Json> Array(const std::vector<NodeId>& ids, uint32_t depth) {
    Json arr = Json::array();
    for (NodeId c : ids) {
      RS_ASSIGN_OR_RETURN(Json v, Encode(c, depth + 1));
      arr.push_back(std::move(v));
    }
    return arr;
  }

  Result<Json> Pairs(const std::vector<NodeId>& ids, uint32_t depth) {
    Json arr = Json::array();
    for (size_t k = 0; k + 1 < ids.size(); k += 2) {
      RS_ASSIGN_OR_RETURN(Json key, Encode(ids[k], depth + 1));
      RS_ASSIGN_OR_RETURN(Json value, Encode(ids[k + 1], depth + 1));
      arr.push_back(Json::array({std::move(key), std::move(value)}));
    }
    return arr;
  }

  Result<Json> Tagged(const char* tag, const std::vector<NodeId>& ids, uint32_t depth) {
    RS_ASSIGN_OR_RETURN(Json arr, Array(ids, depth));
    return Json{{tag, std::move(arr)}};
  }

  Result<Json> EncodeNode(NodeId id, uint32_t depth) {
    const Node& n = tree_.node(id);
    switch (n.kind) {
      case NodeKind::kNone: return Json(nullptr);
      case NodeKind::kBool: return Json(n.b);
      case NodeKind::kInt: return Json(n.i);
      case NodeKind::kBigInt: return BigInt(id, n.text);
      case NodeKind::kFloat:
        if (std::isnan(n.f)) return Json{{"float", "nan"}};
        if (std::isinf(n.f)) return Json{{"float", n.f > 0 ? "inf" : "-inf"}};
        return Json{{"float", n.f}};
      case NodeKind::kStr: return Json(n.text);
      case NodeKind::kBytes: return Json{{"bytes", Hex(n.text)}};
      case NodeKind::kByteArray: return Json{{"bytearray", Hex(n.text)}};
      case NodeKind::kTuple: return Tagged("tuple", n.items, depth);
      case NodeKind::kList: return Array(n.items, depth);
      case NodeKind::kDict: {
        RS_ASSIGN_OR_RETURN(Json pairs, Pairs(n.items, depth));
        return Json{{"dict", std::move(pairs)}};
      }
      case NodeKind::kSet: return Tagged("set", n.items, depth);
      case NodeKind::kFrozenSet: return Tagged("frozenset", n.items, depth);
      case NodeKind::kGlobal: return Json{{"global", Json::array({n.text, n.global_name()})}};
      case NodeKind::kBuild: return Tagged("build", n.items, depth);
      case NodeKind::kPersId: {
        RS_ASSIGN_OR_RETURN(Json pid, Encode(n.items.at(0), depth + 1));
        return Json{{"persid", std::move(pid)}};
      }
      case NodeKind::kReduce:
      case NodeKind::kNewObj: return EncodeObject(id, n, depth);
    }
    return Internal("unknown node kind");
  }

  // Decimal is quadratic in the length: past kMaxDecimalBytes (Python too refuses str() of an int
  // with more than 4300 digits) the bytes are printed as hex, and each shared int is converted
  // once, not at every reference (a pickle of 600 bytes once took 6 s here by DUP-ing one).
  Json BigInt(NodeId id, const std::string& le_bytes) {
    if (le_bytes.size() > kMaxDecimalBytes) return Json{{"int_bytes", Hex(le_bytes)}};
    auto [it, inserted] = decimals_.try_emplace(id);
    if (inserted) it->second = BigIntToDecimal(le_bytes);
    return Json{{"int", it->second}};
  }

  Result<Json> EncodeObject(NodeId id, const Node& n, uint32_t depth) {
    if (n.kind == NodeKind::kReduce) {
      RS_ASSIGN_OR_RETURN(std::optional<TensorRef> tensor, MatchTensor(tree_, id));
      if (tensor) {
        return Json{{"tensor",
                     {{"dtype", std::string(TorchName(tensor->dtype))},
                      {"shape", tensor->shape},
                      {"stride", tensor->stride},
                      {"storage_offset", tensor->storage_offset},
                      {"storage", tensor->storage.key},
                      {"requires_grad", tensor->requires_grad}}}};
      }
    }
    RS_ASSIGN_OR_RETURN(Json out, Tagged(n.kind == NodeKind::kReduce ? "reduce" : "newobj", n.items, depth));
    if (!n.list_items().empty()) {
      RS_ASSIGN_OR_RETURN(out["listitems"], Array(n.list_items(), depth));
    }
    if (!n.dict_items().empty()) {
      RS_ASSIGN_OR_RETURN(out["dictitems"], Pairs(n.dict_items(), depth));
    }
    if (n.state != kNoNode) {
      RS_ASSIGN_OR_RETURN(out["state"], Encode(n.state, depth + 1));
    }
    return out;
  }

  const PickleTree& tree_;
  const TreeJsonLimits limits_;
  std::vector<bool> on_path_;
  uint64_t emitted_ = 0;
  uint64_t spent_ = 0;  // estimated bytes of the JSON so far
  std::unordered_map<NodeId, std::string> decimals_;  // BigInt's conversions, by node
  static constexpr uint64_t kBytesPerNode = 128;
};

}  // namespace

std::string BigIntToDecimal(const std::string& le_bytes) {
  // Magnitude as little-endian bytes, then repeated division by 10 (values are rare and short).
  std::vector<uint8_t> mag(le_bytes.begin(), le_bytes.end());
  const bool negative = !mag.empty() && (mag.back() & 0x80) != 0;
  if (negative) {  // two's complement negate
    unsigned carry = 1;
    for (uint8_t& b : mag) {
      const unsigned v = static_cast<uint8_t>(~b) + carry;
      b = static_cast<uint8_t>(v);
      carry = v >> 8;
    }
  }
  std::string digits;
  while (std::any_of(mag.begin(), mag.end(), [](uint8_t b) { return b != 0; })) {
    unsigned rem = 0;
    for (size_t k = mag.size(); k-- > 0;) {
      const unsigned cur = (rem << 8) | mag[k];
      mag[k] = static_cast<uint8_t>(cur / 10);
      rem = cur % 10;
    }
    digits.push_back(static_cast<char>('0' + rem));
  }
  if (digits.empty()) digits = "0";
  if (negative) digits.push_back('-');
  std::reverse(digits.begin(), digits.end());
  return digits;
}

Result<nlohmann::ordered_json> TreeToJson(const PickleTree& tree, NodeId root, const TreeJsonLimits& limits) {
  Encoder encoder(tree, limits);
  return encoder.Encode(root, 0);
}

}  // namespace reshard::format
