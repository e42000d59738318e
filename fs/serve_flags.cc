#include "fs/serve_flags.h"

namespace reshard::fs {

void AddServeFlags(CLI::App* command, ServeOptions& options) {
  command->add_flag("-f,--foreground", options.foreground,
                    "Stay in the foreground (default: detach once mounted)");
  command->add_flag("--direct-io", options.direct_io,
                    "Bypass the kernel page cache: every read() reaches the server");
  command->add_flag("--single-threaded", options.single_threaded, "Serve requests on one thread");
  command->add_option("--max-threads", options.max_threads,
                      "Most worker threads of the multithreaded loop")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  // One value per -o, so "-o allow_other MOUNTPOINT" cannot swallow the mountpoint.
  command->add_option("-o", options.fuse_options,
                      "FUSE mount options, comma-separated (allow_other, debug, ...); repeatable. "
                      "libfuse's debug output needs --log-level debug")
      ->allow_extra_args(false);
}

}  // namespace reshard::fs
