// reshardfs: the command-line tool. Each subcommand returns a Status; this file is the one
// place that turns a Status into an exit code and a single "reshardfs: error: ..." line.
#include <cstdio>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "fs/inspect_command.h"

namespace {

int Fail(const reshard::Status& status) {
  std::fprintf(stderr, "reshardfs: error: %s\n", status.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
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

  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));

  if (app.got_subcommand(inspect_cmd)) {
    const reshard::Status status = reshard::fs::RunInspect(inspect, std::cout);
    return status.ok() ? 0 : Fail(status);
  }
  return 0;
}
