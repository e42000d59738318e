#include "fs/plan_command.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "fs/served_checkpoint.h"

namespace reshard::fs {
namespace {

std::string Ratio(uint64_t num, uint64_t den) {
  if (den == 0) return "n/a";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(num) / static_cast<double>(den));
  return buf;
}

}  // namespace

Status RunPlan(const PlanOptions& options, std::ostream& out) {
  RS_ASSIGN_OR_RETURN(ServedCheckpoint served, ServedCheckpoint::Load(options.source, options.target));
  const plan::Target& t = served.target();
  const auto& files = served.files();
  nlohmann::json doc;
  doc["source"] = served.checkpoint().dir();
  doc["target"] = {{"tp", t.tp_size},
                   {"dp", t.dp_size},
                   {"zero_stage", t.zero_stage},
                   {"lp_dtype", std::string(format::TorchName(t.lp_dtype))},
                   {"tag", t.tag}};
  uint64_t total_size = 0, total_tensor = 0, total_source = 0;
  for (const plan::PlannedFile& f : files) {
    doc["files"].push_back({{"path", f.path()},
                            {"size", f.size()},
                            {"tensor_bytes", f.storage_bytes()},
                            {"source_bytes", f.source_bytes()}});
    total_size += f.size();
    total_tensor += f.storage_bytes();
    total_source += f.source_bytes();
  }
  // Which files each rank loads: its TP rank's model states (ZeRO-3: its own), its optimizer file.
  const size_t model_files = files.size() - static_cast<size_t>(t.tp_size) * static_cast<size_t>(t.dp_size);
  for (int tp = 0; tp < t.tp_size; ++tp) {
    for (int dp = 0; dp < t.dp_size; ++dp) {
      const plan::PlannedFile& model = files[t.zero_stage == 3 ? static_cast<size_t>(dp) : static_cast<size_t>(tp)];
      const plan::PlannedFile& optim = files[model_files + static_cast<size_t>(tp * t.dp_size + dp)];
      const uint64_t tensor = model.storage_bytes() + optim.storage_bytes();
      const uint64_t source = model.source_bytes() + optim.source_bytes();
      doc["ranks"].push_back({{"tp_rank", tp},
                              {"dp_rank", dp},
                              {"files", {model.path(), optim.path()}},
                              {"tensor_bytes", tensor},
                              {"source_bytes", source},
                              {"read_amplification", tensor ? static_cast<double>(source) / tensor : 0.0}});
    }
  }
  doc["total"] = {{"size", total_size}, {"tensor_bytes", total_tensor}, {"source_bytes", total_source}};
  if (options.json) {
    out << doc.dump(2) << "\n";
    return Status::Ok();
  }
  out << "source: " << served.checkpoint().dir() << "\n"
      << "target: TP " << t.tp_size << " x DP " << t.dp_size << ", ZeRO-" << t.zero_stage << ", lp "
      << format::TorchName(t.lp_dtype) << ", tag " << t.tag << "\n"
      << "files:\n";
  for (const plan::PlannedFile& f : files) out << "  " << f.path() << "  " << f.size() << " bytes\n";
  out << "ranks (tensor bytes served, source bytes read, read amplification):\n";
  for (const auto& r : doc["ranks"]) {
    out << "  tp " << r["tp_rank"].get<int>() << " dp " << r["dp_rank"].get<int>() << ": "
        << r["tensor_bytes"].get<uint64_t>() << ", " << r["source_bytes"].get<uint64_t>() << ", "
        << Ratio(r["source_bytes"].get<uint64_t>(), r["tensor_bytes"].get<uint64_t>()) << "\n";
  }
  out << "total: " << files.size() << " files, " << total_size << " bytes, read amplification "
      << Ratio(total_source, total_tensor) << "\n";
  return Status::Ok();
}

}  // namespace reshard::fs
