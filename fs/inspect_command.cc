#include "fs/inspect_command.h"

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "reshard/format/dtype.h"
#include "reshard/format/torch_archive.h"
#include "reshard/format/tree_json.h"

namespace reshard::fs {
namespace {

using Json = nlohmann::ordered_json;
using format::TorchArchive;

std::string HumanBytes(uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), unit == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[unit]);
  return buf;
}

// Renders the tree_json encoding as indented, Python-like text.
class TextRenderer {
 public:
  explicit TextRenderer(std::ostream& out) : out_(out) {}

  void Render(const Json& v, int indent) {
    if (v.is_null()) { out_ << "None"; return; }
    if (v.is_boolean()) { out_ << (v.get<bool>() ? "True" : "False"); return; }
    if (v.is_number()) { out_ << v.dump(); return; }
    if (v.is_string()) { out_ << Json(v.get<std::string>()).dump(); return; }
    if (v.is_array()) { Sequence("[", v, "]", indent); return; }
    const auto first = v.begin();  // every tagged node is a one-key object (tree_json.h)
    const std::string& tag = first.key();
    const Json& body = first.value();
    if (tag == "tensor") {
      out_ << "tensor(" << body["dtype"].get<std::string>() << ", " << body["shape"].dump();
      if (!IsRowMajor(body["shape"], body["stride"])) out_ << ", stride " << body["stride"].dump();
      if (body["storage_offset"].get<int64_t>() != 0) out_ << ", offset " << body["storage_offset"].dump();
      out_ << ", storage " << body["storage"].get<std::string>() << ")";
    } else if (tag == "int") {
      out_ << body.get<std::string>();
    } else if (tag == "float") {
      out_ << (body.is_string() ? "float('" + body.get<std::string>() + "')" : body.dump());
    } else if (tag == "bytes" || tag == "bytearray") {
      out_ << tag << "(" << body.get<std::string>().size() / 2 << " bytes)";
    } else if (tag == "tuple") {
      Sequence("(", body, ")", indent);
    } else if (tag == "set" || tag == "frozenset") {
      out_ << tag;
      Sequence("({", body, "})", indent);
    } else if (tag == "dict") {
      Mapping(body, indent);
    } else if (tag == "global") {
      out_ << body[0].get<std::string>() << "." << body[1].get<std::string>();
    } else if (tag == "persid") {
      out_ << "persid";
      Sequence("(", Json::array({body}), ")", indent);
    } else if (tag == "build") {
      out_ << "build";
      Sequence("(", body, ")", indent);
    } else {  // reduce / newobj, with the items the pickle added
      Render(body[0], indent);
      Sequence(tag == "newobj" ? ".__new__(" : "(", body[1], ")", indent);
      if (v.contains("listitems")) { out_ << " + items "; Render(v["listitems"], indent); }
      if (v.contains("dictitems")) { out_ << " + items "; Mapping(v["dictitems"], indent); }
      if (v.contains("state")) { out_ << " + state "; Render(v["state"], indent); }
    }
  }

 private:
  void Newline(int indent) { out_ << "\n" << std::string(static_cast<size_t>(indent) * 2, ' '); }

  void Sequence(const char* open, const Json& items, const char* close, int indent) {
    // A tuple body arrives as {"tuple": [...]} when called for reduce args; unwrap it.
    const Json& arr = items.is_object() && items.contains("tuple") ? items["tuple"] : items;
    out_ << open;
    if (!arr.is_array()) {
      Render(arr, indent);
    } else if (!arr.empty() && IsShort(arr)) {
      for (size_t k = 0; k < arr.size(); ++k) {
        if (k) out_ << ", ";
        Render(arr[k], indent);
      }
    } else {
      for (const Json& item : arr) {
        Newline(indent + 1);
        Render(item, indent + 1);
        out_ << ",";
      }
      if (!arr.empty()) Newline(indent);
    }
    out_ << close;
  }

  void Mapping(const Json& pairs, int indent) {
    out_ << "{";
    for (const Json& kv : pairs) {
      Newline(indent + 1);
      Render(kv[0], indent + 1);
      out_ << ": ";
      Render(kv[1], indent + 1);
      out_ << ",";
    }
    if (!pairs.empty()) Newline(indent);
    out_ << "}";
  }

  static bool IsRowMajor(const Json& shape, const Json& stride) {
    int64_t expected = 1;
    for (size_t k = shape.size(); k-- > 0;) {
      if (shape[k].get<int64_t>() != 1 && stride[k].get<int64_t>() != expected) return false;
      expected *= shape[k].get<int64_t>();
    }
    return true;
  }

  static bool IsShort(const Json& arr) {
    if (arr.size() > 8) return false;
    for (const Json& item : arr) {
      if (item.is_object() || item.is_array()) return false;
    }
    return true;
  }

  std::ostream& out_;
};

Json ArchiveJson(const TorchArchive& archive, Json tree) {
  Json records = Json::array();
  for (const auto& r : archive.records()) {
    records.push_back({{"name", r.name}, {"offset", r.data_offset}, {"size", r.size}});
  }
  Json storages = Json::object();
  for (const auto& [key, s] : archive.storages()) {
    const uint64_t item = s.ref.untyped ? 1 : format::ItemSize(s.ref.dtype);
    storages[key] = {{"dtype", std::string(format::TorchName(s.ref.dtype))},
                     {"numel", s.ref.nbytes / item},
                     {"nbytes", s.ref.nbytes},
                     {"record", s.record},
                     {"offset", s.data_offset}};
  }
  return Json{{"file", archive.path()}, {"records", std::move(records)},
              {"storages", std::move(storages)}, {"tree", std::move(tree)}};
}

}  // namespace

Status RunInspect(const InspectOptions& options, std::ostream& out) {
  RS_ASSIGN_OR_RETURN(TorchArchive archive, TorchArchive::Open(options.path));
  auto tree = format::TreeToJson(archive.tree(), archive.tree().root());
  if (!tree.ok()) return tree.status().Annotate(options.path + ": data.pkl");
  if (options.json) {
    out << ArchiveJson(archive, std::move(tree).value()).dump(1) << "\n";
    return Status::Ok();
  }
  uint64_t tensor_bytes = 0;
  for (const auto& [key, s] : archive.storages()) tensor_bytes += s.ref.nbytes;
  out << archive.path() << ": torch.save archive '" << archive.prefix() << "/', "
      << archive.records().size() << " records, " << archive.storages().size() << " storages ("
      << HumanBytes(tensor_bytes) << "), " << archive.tensors().size() << " tensors\n";
  TextRenderer(out).Render(tree.value(), 0);
  out << "\n";
  return Status::Ok();
}

}  // namespace reshard::fs
