// Namespace: the inode table of a mounted reshardfs, built once from a list of files.
//
// A caller lists the files to serve as relative, '/'-separated paths with their contents;
// directories are implied by the paths:
//
//   Build({{"latest", ...}, {"global_step3/mp_rank_00_model_states.pt", ...}})
//     ino 1  ""                                          directory (the root, FUSE_ROOT_ID)
//     ino 2  "latest"                                    file
//     ino 3  "global_step3"                              directory
//     ino 4  "global_step3/mp_rank_00_model_states.pt"   file
//
// Inode numbers are dense: ino = index in the table + kRootIno, assigned in the order the paths
// first name them. The tree never changes after Build(), so nothing counts lookups and an ino
// stays valid for the Namespace's lifetime.
//
// Attributes: files are 0444 and directories 0555 (read-only for everyone, subject to the
// mount's own access rules), owned by the user and group that called Build(); every timestamp
// is the time of Build() (the mount time). A directory's link count is 2 + its subdirectories.
//
// Thread safety: immutable after Build(); every const method may run concurrently from any
// number of threads without locks. The contents are shared (std::shared_ptr), so the caller may
// keep its own references. Movable, not copyable.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/file_content.h"
#include "reshard/base/status.h"

namespace reshard::fs {

// The root directory's ino; equal to FUSE_ROOT_ID (checked where the FUSE headers are included).
inline constexpr uint64_t kRootIno = 1;

struct NamespaceEntry {
  std::string path;  // relative, '/'-separated: "global_step3/mp_rank_00_model_states.pt"
  std::shared_ptr<const FileContent> content;  // must not be null
};

// One file or directory of a Namespace.
struct NamespaceNode {
  std::string name;         // last path component; "" for the root
  std::string path;         // the full relative path; "" for the root
  uint64_t parent_ino = 0;  // the root is its own parent
  std::vector<uint64_t> children;              // directories: child inos, sorted by name
  std::shared_ptr<const FileContent> content;  // files: the content; directories: null

  bool is_dir() const { return content == nullptr; }
};

class Namespace {
 public:
  // Builds the tree. InvalidArgument, naming the path, for: an empty path, an absolute path, an
  // empty, "." or ".." component, a component longer than NAME_MAX or holding a NUL byte, a
  // null content, a size beyond off_t, a path that is both a file and a directory ("a" and
  // "a/b"), and a duplicate.
  static Result<Namespace> Build(std::vector<NamespaceEntry> entries);

  Namespace(Namespace&&) noexcept = default;
  Namespace& operator=(Namespace&&) noexcept = default;
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  // The node of `ino`, or null if no such ino exists. The pointer lives as long as *this.
  const NamespaceNode* Find(uint64_t ino) const;

  // The ino of entry `name` in directory `parent_ino`; nullopt when `parent_ino` is not a
  // directory of this Namespace or has no such entry ("." and ".." are never entries).
  // O(log children).
  std::optional<uint64_t> Lookup(uint64_t parent_ino, std::string_view name) const;

  // The attributes of `ino` as stat(2) reports them (st_ino, st_mode, st_nlink, st_size,
  // st_blocks, st_blksize, owner, times); nullopt for an unknown ino.
  std::optional<struct stat> Attributes(uint64_t ino) const;

  // Number of inodes, directories (the root included) and files together.
  uint64_t inode_count() const { return nodes_.size(); }
  // Sum of all file sizes in bytes (saturates at UINT64_MAX).
  uint64_t total_file_bytes() const { return total_file_bytes_; }

  // The I/O size reported as st_blksize: FUSE's largest request, so buffered readers (stdio,
  // Python's io) ask for whole requests.
  static constexpr uint64_t kPreferredIoBytes = uint64_t{1} << 20;

 private:
  Namespace() = default;

  std::vector<NamespaceNode> nodes_;  // nodes_[ino - kRootIno]
  uint64_t total_file_bytes_ = 0;
  timespec build_time_{};
  uid_t uid_ = 0;
  gid_t gid_ = 0;
};

}  // namespace reshard::fs
