#include "fs/namespace.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "fs/inline_content.h"

namespace reshard::fs {
namespace {

std::shared_ptr<const FileContent> Bytes(std::string bytes) {
  return std::make_shared<const InlineContent>(std::move(bytes));
}

std::vector<std::string> ChildNames(const Namespace& ns, uint64_t ino) {
  std::vector<std::string> names;
  for (uint64_t child : ns.Find(ino)->children) names.push_back(ns.Find(child)->name);
  return names;
}

Status BuildStatus(std::vector<std::string> paths) {
  std::vector<NamespaceEntry> entries;
  for (std::string& path : paths) entries.push_back({std::move(path), Bytes("x")});
  return Namespace::Build(std::move(entries)).status();
}

// Builds the tree of a small served checkpoint:
//   latest, a_first, global_step3/{rank files}, global_step3/sub/deep/file
Namespace Checkpoint() {
  Result<Namespace> ns = Namespace::Build({
      {"latest", Bytes("global_step3")},
      {"global_step3/zero_pp_rank_1_mp_rank_00_model_states.pt", Bytes("rank 1")},
      {"global_step3/zero_pp_rank_0_mp_rank_00_model_states.pt", Bytes("rank 0!")},
      {"global_step3/sub/deep/file", Bytes("")},
      {"a_first", Bytes("a")},
  });
  REQUIRE(ns.ok());
  return std::move(ns).value();
}

TEST_CASE("Namespace: directories are implied by paths, inos are dense from the root", "[fs]") {
  const Namespace ns = Checkpoint();
  CHECK(ns.inode_count() == 9);  // root, 5 files, global_step3, sub, deep
  CHECK(ns.total_file_bytes() == 12 + 6 + 7 + 0 + 1);

  const NamespaceNode* root = ns.Find(kRootIno);
  REQUIRE(root != nullptr);
  CHECK(root->is_dir());
  CHECK(root->name.empty());
  CHECK(root->path.empty());
  CHECK(root->parent_ino == kRootIno);
  CHECK(ChildNames(ns, kRootIno) == std::vector<std::string>{"a_first", "global_step3", "latest"});

  const std::optional<uint64_t> step = ns.Lookup(kRootIno, "global_step3");
  REQUIRE(step.has_value());
  CHECK(ns.Find(*step)->is_dir());
  CHECK(ns.Find(*step)->path == "global_step3");
  CHECK(ChildNames(ns, *step) == std::vector<std::string>{"sub", "zero_pp_rank_0_mp_rank_00_model_states.pt",
                                                          "zero_pp_rank_1_mp_rank_00_model_states.pt"});
  const std::optional<uint64_t> rank0 = ns.Lookup(*step, "zero_pp_rank_0_mp_rank_00_model_states.pt");
  REQUIRE(rank0.has_value());
  const NamespaceNode* file = ns.Find(*rank0);
  CHECK_FALSE(file->is_dir());
  CHECK(file->path == "global_step3/zero_pp_rank_0_mp_rank_00_model_states.pt");
  CHECK(file->parent_ino == *step);
  CHECK(file->content->size() == 7);
  CHECK(file->children.empty());

  const std::optional<uint64_t> sub = ns.Lookup(*step, "sub");
  REQUIRE(sub.has_value());
  const std::optional<uint64_t> deep = ns.Lookup(*sub, "deep");
  REQUIRE(deep.has_value());
  REQUIRE(ns.Lookup(*deep, "file").has_value());
  CHECK(ns.Find(*ns.Lookup(*deep, "file"))->path == "global_step3/sub/deep/file");
}

TEST_CASE("Namespace: lookups that find nothing", "[fs]") {
  const Namespace ns = Checkpoint();
  CHECK_FALSE(ns.Lookup(kRootIno, "missing").has_value());
  CHECK_FALSE(ns.Lookup(kRootIno, "").has_value());
  CHECK_FALSE(ns.Lookup(kRootIno, ".").has_value());
  CHECK_FALSE(ns.Lookup(kRootIno, "..").has_value());
  CHECK_FALSE(ns.Lookup(kRootIno, "global_step3/sub").has_value());  // one component at a time
  CHECK_FALSE(ns.Lookup(kRootIno, "latesT").has_value());
  CHECK_FALSE(ns.Lookup(kRootIno, "a").has_value());                 // a prefix of a_first
  CHECK_FALSE(ns.Lookup(*ns.Lookup(kRootIno, "latest"), "x").has_value());  // a file, not a dir
  CHECK_FALSE(ns.Lookup(0, "latest").has_value());
  CHECK_FALSE(ns.Lookup(1000, "latest").has_value());
  CHECK(ns.Find(0) == nullptr);
  CHECK(ns.Find(ns.inode_count() + kRootIno) == nullptr);
  CHECK(ns.Find(ns.inode_count() + kRootIno - 1) != nullptr);
  CHECK_FALSE(ns.Attributes(0).has_value());
  CHECK_FALSE(ns.Attributes(UINT64_MAX).has_value());
}

TEST_CASE("Namespace: attributes are read-only, fixed, and count subdirectories", "[fs]") {
  const Namespace ns = Checkpoint();
  const std::optional<struct stat> root = ns.Attributes(kRootIno);
  REQUIRE(root.has_value());
  CHECK(root->st_ino == kRootIno);
  CHECK(root->st_mode == (S_IFDIR | 0555));
  CHECK(root->st_nlink == 3);  // ".", its entry, and global_step3's ".."

  const uint64_t step = *ns.Lookup(kRootIno, "global_step3");
  CHECK(ns.Attributes(step)->st_nlink == 3);  // one subdirectory: sub

  const uint64_t latest = *ns.Lookup(kRootIno, "latest");
  const std::optional<struct stat> file = ns.Attributes(latest);
  REQUIRE(file.has_value());
  CHECK(file->st_ino == latest);
  CHECK(file->st_mode == (S_IFREG | 0444));
  CHECK(file->st_nlink == 1);
  CHECK(file->st_size == 12);
  CHECK(file->st_blocks == 1);
  CHECK(file->st_blksize == static_cast<blksize_t>(Namespace::kPreferredIoBytes));
  CHECK(file->st_uid == getuid());
  CHECK(file->st_gid == getgid());
  // Every inode carries the same build time, and asking again gives the same answer.
  CHECK(file->st_mtim.tv_sec == root->st_mtim.tv_sec);
  CHECK(file->st_mtim.tv_nsec == root->st_mtim.tv_nsec);
  CHECK(file->st_ctim.tv_sec == file->st_mtim.tv_sec);
  CHECK(ns.Attributes(latest)->st_mtim.tv_nsec == file->st_mtim.tv_nsec);
  CHECK(file->st_mtim.tv_sec > 0);
}

TEST_CASE("Namespace: an empty list serves an empty root", "[fs]") {
  Result<Namespace> ns = Namespace::Build({});
  REQUIRE(ns.ok());
  CHECK(ns->inode_count() == 1);
  CHECK(ns->Find(kRootIno)->children.empty());
  CHECK(ns->Attributes(kRootIno)->st_nlink == 2);
}

TEST_CASE("Namespace: refuses paths it cannot serve, naming them", "[fs]") {
  struct Case {
    std::vector<std::string> paths;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{""}, "served path \"\": empty path"},
      {{"/abs"}, "served path \"/abs\": absolute path (must be relative)"},
      {{"a//b"}, "served path \"a//b\": empty component"},
      {{"a/"}, "served path \"a/\": empty component"},
      {{"./a"}, "served path \"./a\": component \".\" is not allowed"},
      {{"a/../b"}, "served path \"a/../b\": component \"..\" is not allowed"},
      {{"a/.."}, "served path \"a/..\": component \"..\" is not allowed"},
      {{std::string(256, 'n')}, "served path \"" + std::string(256, 'n') + "\": component longer than 255 bytes"},
      {{std::string("a\0b", 3)}, "served path \"" + std::string("a\0b", 3) + "\": NUL byte in name"},
      {{"x", "y", "x"}, "served path \"x\": listed twice"},
      {{"d/f", "d/f"}, "served path \"d/f\": listed twice"},
      {{"a", "a/b"}, "served path \"a/b\": \"a\" would be both a file and a directory"},
      {{"a/b", "a"}, "served path \"a\": \"a\" would be both a file and a directory"},
      {{"a/b/c", "a/b"}, "served path \"a/b\": \"a/b\" would be both a file and a directory"},
      {{"a/b", "a/b/c/d"}, "served path \"a/b/c/d\": \"a/b\" would be both a file and a directory"},
  };
  for (const Case& c : cases) {
    INFO(c.message);
    const Status status = BuildStatus(c.paths);
    CHECK(status.code() == StatusCode::kInvalidArgument);
    CHECK(status.message() == c.message);
  }
  CHECK(BuildStatus({std::string(255, 'n'), "..a", "a.", "..."}).ok());

  Result<Namespace> null_content = Namespace::Build({{"f", nullptr}});
  CHECK(null_content.status().message() == "served path \"f\": no content");
}

}  // namespace
}  // namespace reshard::fs
