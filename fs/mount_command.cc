#include "fs/mount_command.h"

#include <malloc.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "fs/inline_content.h"
#include "fs/namespace.h"
#include "fs/passthrough_content.h"
#include "fs/planned_content.h"
#include "fs/served_checkpoint.h"

namespace reshard::fs {
namespace {

// Regular files beside the universal tag folder, except the names the mount serves itself.
Status AddRunFolderFiles(const ServedCheckpoint& served, std::vector<NamespaceEntry>& entries) {
  namespace stdfs = std::filesystem;
  const stdfs::path run = stdfs::path(served.checkpoint().dir()).parent_path();
  std::error_code ec;
  stdfs::directory_iterator it(run.empty() ? stdfs::path(".") : run, ec);
  if (ec) return IoError(run.string() + ": " + ec.message());
  for (const stdfs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (name == "latest" || name == "latest_universal" || name == served.tag()) continue;
    if (!e.is_regular_file(ec)) continue;
    RS_ASSIGN_OR_RETURN(std::shared_ptr<const PassthroughContent> content, PassthroughContent::Create(e.path().string()));
    entries.push_back({name, std::move(content)});
  }
  return Status::Ok();
}

// The HF model files of the run folder (a Trainer's checkpoint-N/) beside <tag>/model.safetensors
// too, so that from_pretrained(MOUNT/<tag>) finds the config with the weights.
Status AddModelConfigFiles(const ServedCheckpoint& served, std::vector<NamespaceEntry>& entries) {
  namespace stdfs = std::filesystem;
  const stdfs::path run = stdfs::path(served.checkpoint().dir()).parent_path();
  for (const char* name : {"config.json", "generation_config.json"}) {
    std::error_code ec;
    const stdfs::path file = (run.empty() ? stdfs::path(".") : run) / name;
    if (!stdfs::is_regular_file(file, ec)) continue;
    RS_ASSIGN_OR_RETURN(std::shared_ptr<const PassthroughContent> content, PassthroughContent::Create(file.string()));
    entries.push_back({served.tag() + "/" + name, std::move(content)});
  }
  return Status::Ok();
}

// Plans the mount and builds what it serves. The checkpoint's index (parameter entries, parsed
// model-states trees) dies with `served` at return: the namespace holds only the planned files,
// their views and the source descriptors.
Result<Namespace> PlanNamespace(const MountOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  RS_ASSIGN_OR_RETURN(ServedCheckpoint served, ServedCheckpoint::Load(options.source, options.target));
  const double plan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<NamespaceEntry> entries;
  entries.push_back({"latest", std::make_shared<const InlineContent>(served.tag())});
  for (size_t i = 0; i < served.files().size(); ++i) {
    entries.push_back({served.files()[i].path(),
                       std::make_shared<const PlannedContent>(served.shared_files(), i, served.shared_sources())});
  }
  for (size_t i = 0; i < served.views().size(); ++i) {
    const std::shared_ptr<const plan::PlannedStorages> storages(served.shared_files(),
                                                                &served.files()[i].storages());
    const std::shared_ptr<const plan::SafetensorsView> view(served.shared_views(), &served.views()[i]);
    entries.push_back({served.view_paths()[i],
                       std::make_shared<const SafetensorsContent>(storages, view, served.shared_sources())});
  }
  if (!served.universal_root().empty()) {
    entries.push_back({"latest_universal", std::make_shared<const InlineContent>(served.universal_root())});
    for (size_t i = 0; i < served.universal_files().size(); ++i) {
      entries.push_back({served.universal_files()[i].path(),
                         std::make_shared<const PlannedContent>(served.shared_universal_files(), i,
                                                                served.shared_sources())});
    }
    for (const auto& [path, source] : served.universal_copies()) {
      RS_ASSIGN_OR_RETURN(std::shared_ptr<const PassthroughContent> content, PassthroughContent::Create(source));
      entries.push_back({path, std::move(content)});
    }
  }
  if (served.weights_view()) {
    entries.push_back({served.weights_path(),
                       std::make_shared<const SafetensorsContent>(served.weights_storages(), served.weights_view(),
                                                                  served.shared_sources())});
    RS_RETURN_IF_ERROR(AddModelConfigFiles(served, entries));
  } else {
    spdlog::warn("no {}/model.safetensors: {}", served.tag(), served.weights_unavailable());
  }
  RS_RETURN_IF_ERROR(AddRunFolderFiles(served, entries));
  RS_ASSIGN_OR_RETURN(Namespace ns, Namespace::Build(std::move(entries)));
  const plan::Target& t = served.target();
  uint64_t bytes = 0;
  for (const plan::PlannedFile& file : served.files()) bytes += file.size();
  for (const plan::SafetensorsView& view : served.views()) bytes += view.size();
  for (const plan::PlannedFile& file : served.universal_files()) bytes += file.size();
  spdlog::info("serving {} as TP {} x DP {}, ZeRO-{}, tag {}: {} checkpoint files, {} safetensors views and {} "
               "universal-view files, {} bytes, {} source files, planned in {:.3f} s",
               served.checkpoint().dir(), t.tp_size, t.dp_size, t.zero_stage, t.tag, served.files().size(),
               served.views().size(), served.universal_files().size(), bytes, served.sources().num_files(),
               plan_seconds);
  return ns;
}

}  // namespace

Status RunMount(const MountOptions& options) {
  RS_ASSIGN_OR_RETURN(Namespace ns, PlanNamespace(options));
  // Planning freed far more than it kept (every parsed state file, the checkpoint's index); give
  // the freed heap back to the system before serving for days (measured: 59 -> 43 MB of RSS for
  // a 4,000-parameter checkpoint before the index was dropped too).
  ::malloc_trim(0);
  return Serve(ns, options.serve);
}

}  // namespace reshard::fs
