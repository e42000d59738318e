// reshardfs: the command-line tool. Each subcommand returns a Status; this file is the one
// place that turns a Status into an exit code and a single "reshardfs: error: ..." line.
#include <sys/resource.h>

#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "fs/fuse_server.h"
#include "fs/inspect_command.h"
#include "fs/materialize_command.h"
#include "fs/mount_command.h"
#include "fs/plan_command.h"
#include "fs/namespace.h"
#include "fs/null_content.h"
#include "fs/serve_flags.h"
#include "fs/verify_command.h"

namespace {

int Fail(const reshard::Status& status) {
  std::fprintf(stderr, "reshardfs: error: %s\n", status.message().c_str());
  return 1;
}

struct ServeNullOptions {
  reshard::fs::ServeOptions serve;
  uint64_t size_bytes = 0;
  unsigned files = 1;
};

// `reshardfs serve-null`: files null_0 .. null_{N-1} of NullContent, to measure FUSE alone.
reshard::Status RunServeNull(const ServeNullOptions& options) {
  const auto content = std::make_shared<const reshard::fs::NullContent>(options.size_bytes);
  std::vector<reshard::fs::NamespaceEntry> entries;
  for (unsigned i = 0; i < options.files; ++i) entries.push_back({"null_" + std::to_string(i), content});
  RS_ASSIGN_OR_RETURN(const reshard::fs::Namespace ns, reshard::fs::Namespace::Build(std::move(entries)));
  return reshard::fs::Serve(ns, options.serve);
}

// Every source file stays open from planning to unmount (reads go through the descriptors the plan
// opened), and a universal checkpoint has about four files per parameter: a 70B Llama about 2,900,
// past the soft limit of 1024 open files most shells start with. The hard limit is what the
// administrator allows; raising the soft one to it needs no privilege. On failure the old limit
// stays and an open beyond it fails with EMFILE, naming the file.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  RaiseOpenFileLimit();
  CLI::App app{"reshardfs: serve a DeepSpeed universal checkpoint at a new TP x DP layout"};
  app.set_version_flag("--version", std::string("reshardfs ") + RESHARDFS_VERSION);
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));

  reshard::fs::InspectOptions inspect;
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "Show a torch.save file: its pickle tree and tensors");
  inspect_cmd->add_option("FILE", inspect.path, "A torch.save (.pt) file")->required();
  inspect_cmd->add_flag("--json", inspect.json, "Machine-readable output (records, storages, tree)");

  reshard::fs::PlanOptions plan;
  CLI::App* plan_cmd = app.add_subcommand("plan", "Show the files a target layout would serve, and what each rank reads");
  plan_cmd->add_option("SRC", plan.source, "Universal checkpoint: its tag folder, or the folder with latest_universal")
      ->required();
  reshard::fs::AddTargetFlags(plan_cmd, plan.target);
  plan_cmd->add_flag("--json", plan.json, "Machine-readable output");

  reshard::fs::MaterializeOptions materialize;
  CLI::App* materialize_cmd =
      app.add_subcommand("materialize", "Write the target layout's checkpoint to a folder (what mount serves)");
  materialize_cmd->add_option("SRC", materialize.source, "Universal checkpoint: its tag folder, or its parent")
      ->required();
  materialize_cmd->add_option("OUT_DIR", materialize.out_dir, "A new or empty folder")->required();
  reshard::fs::AddTargetFlags(materialize_cmd, materialize.target);
  materialize_cmd->add_flag("-q,--quiet", materialize.quiet, "Print no file list and no progress, only errors");

  reshard::fs::MountOptions mount;
  CLI::App* mount_cmd = app.add_subcommand(
      "mount", "Serve a universal checkpoint as the native checkpoint of a target layout (read-only FUSE)");
  mount_cmd->add_option("SRC", mount.source, "Universal checkpoint: its tag folder, or the folder with latest_universal")
      ->required();
  mount_cmd->add_option("MOUNTPOINT", mount.serve.mountpoint, "An existing empty folder")->required();
  reshard::fs::AddTargetFlags(mount_cmd, mount.target);
  reshard::fs::AddServeFlags(mount_cmd, mount.serve);

  reshard::fs::VerifyOptions verify;
  CLI::App* verify_cmd = app.add_subcommand(
      "verify", "Check a universal checkpoint (and, with target flags, every file a mount would serve)");
  verify_cmd->add_option("SRC", verify.source, "Universal checkpoint: its tag folder, or the folder with latest_universal")
      ->required();
  reshard::fs::AddTargetFlags(verify_cmd, verify.target);
  verify_cmd->add_flag("--json", verify.json, "Machine-readable output");

  std::string umount_point;
  CLI::App* umount_cmd = app.add_subcommand("umount", "Unmount a reshardfs mount");
  umount_cmd->add_option("MOUNTPOINT", umount_point, "Where it is mounted")->required();

  // A benchmark tool, so not listed in --help.
  ServeNullOptions serve_null;
  CLI::App* serve_null_cmd = app.add_subcommand(
      "serve-null", "Serve N files of a fixed pattern, to measure the FUSE transport alone");
  serve_null_cmd->group("");
  serve_null_cmd->add_option("MOUNTPOINT", serve_null.serve.mountpoint, "An existing empty folder")->required();
  serve_null_cmd->add_option("--size", serve_null.size_bytes, "Bytes per file (suffixes: k, M, G, ...)")
      ->transform(CLI::AsSizeValue(false))
      ->required();
  serve_null_cmd->add_option("--files", serve_null.files, "Number of files, null_0 .. null_{N-1}")
      ->check(CLI::Range(1u, 1000000u))
      ->capture_default_str();
  reshard::fs::AddServeFlags(serve_null_cmd, serve_null.serve);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A usage error is one line in the same form as every other error.
    std::fprintf(stderr, "reshardfs: error: %s (see --help)\n", e.what());
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));

  reshard::Status status;
  if (app.got_subcommand(inspect_cmd)) {
    status = reshard::fs::RunInspect(inspect, std::cout);
  } else if (app.got_subcommand(plan_cmd)) {
    status = reshard::fs::RunPlan(plan, std::cout);
  } else if (app.got_subcommand(materialize_cmd)) {
    status = reshard::fs::RunMaterialize(materialize, std::cout, stderr);
  } else if (app.got_subcommand(mount_cmd)) {
    status = reshard::fs::RunMount(mount);
  } else if (app.got_subcommand(verify_cmd)) {
    status = reshard::fs::RunVerify(verify, std::cout);
  } else if (app.got_subcommand(umount_cmd)) {
    status = reshard::fs::Unmount(umount_point);
  } else if (app.got_subcommand(serve_null_cmd)) {
    status = RunServeNull(serve_null);
  }
  return status.ok() ? 0 : Fail(status);
}
