// ListFolder: the entries of a folder open as a descriptor, read with getdents64(2) (Linux):
// a few system calls per folder, no DIR stream, and no path lookup. Indexing a universal
// checkpoint lists one folder per parameter, 100,000 of them for a large MoE model.
//
// Thread safety: no shared state; the descriptor's read position moves, so one descriptor is
// listed by one thread at a time. Public header: C++17.
#pragma once

#include <string>
#include <vector>

#include "reshard/base/status.h"

namespace reshard {

struct FolderEntry {
  std::string name;
  // A regular file, or a symbolic link to one (as stat(2) sees it; a dangling link is not).
  bool regular = false;
};

// Every entry of the folder open as `dir_fd` but "." and "..", in the order the file system
// returns them. `path` names the folder in messages. Errors: kIoError naming `path` when
// getdents64 fails (ENOTDIR for a descriptor that is not a folder).
Result<std::vector<FolderEntry>> ListFolder(int dir_fd, const std::string& path);

}  // namespace reshard
