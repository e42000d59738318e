// The command-line flags every serving subcommand shares (serve-null, mount), parsed straight
// into a ServeOptions:
//
//   -f, --foreground     stay in the foreground (default: detach once mounted)
//   --direct-io          bypass the kernel page cache
//   --single-threaded    serve every request on one thread
//   --max-threads N      most worker threads of the multithreaded loop
//   -o OPT[,OPT...]      extra FUSE mount options (allow_other, debug, ...); repeatable
//
// The MOUNTPOINT positional is left to the subcommand, which knows where it goes among its own
// positionals.
#pragma once

#include <CLI/CLI.hpp>

#include "fs/fuse_server.h"

namespace reshard::fs {

// Adds the flags to `command`; parsing writes into `options`, which must outlive the parse.
void AddServeFlags(CLI::App* command, ServeOptions& options);

}  // namespace reshard::fs
