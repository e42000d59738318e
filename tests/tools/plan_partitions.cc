// plan_partitions: materialises the ZeRO-1/2 flat partitions (ZeRO-3: sub-group flats) the planner assigns to every
// target rank, for tests/integration/test_plan_partitions.py to compare with DeepSpeed's own
// load_universal (tests/integration/ds_reference.py).
//
//   plan_partitions UCP --tp T --dp D --zero-stage S OUT_DIR
// writes OUT_DIR/t<t>_r<r>_g<g>_<state>.bin (raw elements in the source dtype) and
// OUT_DIR/manifest.json (per rank and group: partition sizes, padding and parameter names).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "reshard/base/mapped_file.h"
#include "reshard/plan/zero12_partition_plan.h"
#include "reshard/plan/zero3_partition_plan.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace {

using reshard::Result;
using reshard::Status;
namespace plan = reshard::plan;

// Copies an extent list out of mapped source files (a test tool: the FUSE server reads sources
// with pread on its own path).
Result<std::string> Materialize(const std::vector<plan::Source>& sources,
                                std::map<uint32_t, reshard::MappedFile>& mapped, const plan::ExtentList& list) {
  const size_t item = sources.empty() ? 4 : reshard::format::ItemSize(sources[0].dtype);
  std::string out(plan::NumElements(list) * item, '\0');
  size_t dest = 0;
  for (const plan::Extent& e : list) {
    if (e.gather.zero) {
      dest += e.gather.numel() * item;
      continue;
    }
    const plan::Source& s = sources.at(e.source);
    if (!mapped.count(e.source)) {
      RS_ASSIGN_OR_RETURN(mapped[e.source], reshard::MappedFile::Open(s.path));
    }
    const uint8_t* base = mapped[e.source].data() + s.data_offset;
    for (uint64_t r = 0; r < e.gather.rows; ++r) {
      const size_t n = e.gather.row_elems * item;
      std::memcpy(out.data() + dest, base + (e.gather.start + r * e.gather.row_stride) * item, n);
      dest += n;
    }
  }
  return out;
}

Status WriteStates(const std::string& out_dir, int t, int r, size_t g,
                   const std::map<std::string, plan::ExtentList>& states, const plan::SourceTable& sources,
                   std::map<uint32_t, reshard::MappedFile>& mapped) {
  for (const auto& [state, extents] : states) {
    RS_ASSIGN_OR_RETURN(std::string bytes, Materialize(sources.sources(), mapped, extents));
    const std::string path = out_dir + "/t" + std::to_string(t) + "_r" + std::to_string(r) + "_g" +
                             std::to_string(g) + "_" + state + ".bin";
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  return Status::Ok();
}

Status Run(const std::string& ucp_path, int tp, int dp, int stage, const std::string& out_dir) {
  RS_ASSIGN_OR_RETURN(reshard::ucp::UniversalCheckpoint ckpt, reshard::ucp::UniversalCheckpoint::Open(ucp_path));
  if (stage < 1 || stage > 3) return reshard::InvalidArgument("ZeRO stage must be 1, 2 or 3");
  plan::SourceTable sources;
  std::map<uint32_t, reshard::MappedFile> mapped;
  nlohmann::ordered_json manifest = nlohmann::ordered_json::array();
  plan::Target target;
  target.tp_size = tp;
  target.dp_size = dp;
  for (int t = 0; t < tp; ++t) {
    for (int r = 0; r < dp; ++r) {
      if (stage == 3) {
        RS_ASSIGN_OR_RETURN(auto subs, plan::PlanZero3Rank(ckpt, target, t, r, sources));
        for (size_t g = 0; g < subs.size(); ++g) {
          manifest.push_back({{"tp_rank", t}, {"dp_rank", r}, {"group", g}, {"param_group", subs[g].param_group},
                              {"partition_numel", subs[g].flat_numel}, {"params", subs[g].param_names}});
          RS_RETURN_IF_ERROR(WriteStates(out_dir, t, r, g, subs[g].states, sources, mapped));
        }
        continue;
      }
      RS_ASSIGN_OR_RETURN(auto groups, plan::PlanZero12Rank(ckpt, target, t, r, sources));
      for (size_t g = 0; g < groups.size(); ++g) {
        const plan::RankGroupPartition& part = groups[g];
        manifest.push_back({{"tp_rank", t}, {"dp_rank", r}, {"group", g},
                            {"partition_numel", part.layout.partition_numel},
                            {"padded_numel", part.layout.padded_numel},
                            {"group_padding", part.layout.group_padding},
                            {"params", part.param_names}});
        RS_RETURN_IF_ERROR(WriteStates(out_dir, t, r, g, part.states, sources, mapped));
      }
    }
  }
  std::ofstream(out_dir + "/manifest.json") << manifest.dump(1) << "\n";
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Materialise planned ZeRO partitions (test tool)"};
  std::string ucp_path, out_dir;
  int tp = 1, dp = 1, stage = 1;
  app.add_option("UCP", ucp_path)->required();
  app.add_option("OUT_DIR", out_dir)->required();
  app.add_option("--tp", tp);
  app.add_option("--dp", dp);
  app.add_option("--zero-stage", stage);
  CLI11_PARSE(app, argc, argv);
  const Status status = Run(ucp_path, tp, dp, stage, out_dir);
  if (!status.ok()) {
    std::fprintf(stderr, "plan_partitions: error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
