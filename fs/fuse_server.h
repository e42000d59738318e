// Serve(): mounts a Namespace as a read-only FUSE filesystem and serves it until unmounted.
//
// This is the only code that talks to libfuse (3.14, low-level API). It knows nothing about what
// it serves: a caller builds a Namespace of its own FileContents (fs/namespace.h) and calls
// Serve(), which returns once the filesystem is unmounted:
//
//   RS_ASSIGN_OR_RETURN(Namespace ns, Namespace::Build(std::move(entries)));
//   return Serve(ns, options);  // blocks while mounted
//
// What the mount looks like:
// - Read-only (`-o ro`, every file 0444, directories 0555, writes refused with EROFS), with
//   fsname and subtype "reshardfs" (type "fuse.reshardfs" in /proc/mounts) and the kernel
//   checking permissions (default_permissions). Only the mounting user can enter it unless
//   `-o allow_other` is passed.
// - Contents never change while mounted, so entries, negative entries and attributes are
//   cached for attr_timeout_s, and the page cache is kept across opens (keep_cache) unless
//   direct_io is set.
// - Requests are up to 1 MiB (max_write, from which libfuse 3.14 derives max_pages, which caps
//   reads too). Buffered reads are further cut to the kernel's readahead window.
//
// Errors: a FileContent::Read() error fails that one read with EIO, and a
// FileContent::CheckOpen() error that one open; each logs one spdlog warning naming the path, and
// everything else goes on being served.
#pragma once

#include <string>
#include <vector>

#include "fs/namespace.h"
#include "reshard/base/status.h"

namespace reshard::fs {

struct ServeOptions {
  std::string mountpoint;        // an existing empty directory that nothing is mounted on
  bool foreground = false;       // false: detach into the background once mounted
  bool direct_io = false;        // bypass the page cache: every read() becomes FUSE requests
  bool single_threaded = false;  // serve requests on the calling thread only
  unsigned max_threads = 10;     // multithreaded loop: most worker threads (libfuse's default)
  double attr_timeout_s = 3600;  // kernel cache time for entries and attributes, in seconds
  std::vector<std::string> fuse_options;  // extra mount options, one "-o" value each ("a,b=c")
};

// Mounts `ns` at options.mountpoint and serves it until the filesystem is unmounted
// (`reshardfs umount`, `fusermount3 -u`, umount(8)) or the process gets SIGINT, SIGTERM or
// SIGHUP, which unmount it. Returns OK after such an ending. A signal the process inherited as
// ignored stays ignored (libfuse installs its handler only over the default disposition): a
// background job of a non-interactive shell ignores SIGINT, and `nohup` SIGHUP.
//
// Every error before the mount exists (a missing, non-empty or already-mounted mountpoint, a bad
// option, no /dev/fuse, mount refused) is returned with libfuse's own explanation in the
// message, and nothing stays mounted. With foreground == false the process forks after
// mounting: the parent exits 0 (the mount is then ready) and the child serves, with its standard
// streams on /dev/null and "/" as its working directory. With foreground == true the working
// directory is left alone.
//
// Process-wide effects while it runs: FUSE's signal handlers for SIGINT, SIGTERM and SIGHUP
// (SIGPIPE ignored) and libfuse's log sink (sent to spdlog); both are restored on return. Call
// it from one thread at a time. `ns` must outlive the call.
Status Serve(const Namespace& ns, const ServeOptions& options);

// Unmounts the reshardfs filesystem mounted at `mountpoint` (with fusermount3 -u, which works
// for root and for the user who mounted it). NotFound if nothing is mounted there,
// InvalidArgument if the mount there is not a reshardfs one, IoError with fusermount3's own
// message if it fails (e.g. "Device or resource busy" while a file is open).
Status Unmount(const std::string& mountpoint);

}  // namespace reshard::fs
