#include "fs/namespace.h"

#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>

namespace reshard::fs {
namespace {

Status BadPath(const std::string& path, const std::string& why) {
  return InvalidArgument("served path \"" + path + "\": " + why);
}

// Splits `path` into its components, or says why it cannot be served.
Result<std::vector<std::string_view>> SplitPath(const std::string& path) {
  if (path.empty()) return BadPath(path, "empty path");
  if (path.front() == '/') return BadPath(path, "absolute path (must be relative)");
  std::vector<std::string_view> components;
  std::string_view rest = path;
  while (true) {
    const size_t slash = rest.find('/');
    const std::string_view component = rest.substr(0, slash);
    if (component.empty()) return BadPath(path, "empty component");
    if (component == "." || component == "..") {
      return BadPath(path, "component \"" + std::string(component) + "\" is not allowed");
    }
    if (component.size() > NAME_MAX) {
      return BadPath(path, "component longer than " + std::to_string(NAME_MAX) + " bytes");
    }
    if (component.find('\0') != std::string_view::npos) return BadPath(path, "NUL byte in name");
    components.push_back(component);
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  return components;
}

}  // namespace

Result<Namespace> Namespace::Build(std::vector<NamespaceEntry> entries) {
  Namespace ns;
  ns.nodes_.push_back(NamespaceNode{"", "", kRootIno, {}, nullptr});
  // Each directory's entries by name while building; std::map keeps them sorted, and they
  // become NamespaceNode::children at the end.
  std::vector<std::map<std::string, uint64_t, std::less<>>> entries_by_name(1);

  for (NamespaceEntry& entry : entries) {
    if (entry.content == nullptr) return BadPath(entry.path, "no content");
    RS_ASSIGN_OR_RETURN(const std::vector<std::string_view> components, SplitPath(entry.path));
    uint64_t dir_ino = kRootIno;
    for (size_t i = 0; i < components.size(); ++i) {
      const bool last = i + 1 == components.size();
      const std::string_view name = components[i];
      // Components are views into entry.path, so their end offset is the prefix length.
      const size_t prefix_bytes = static_cast<size_t>(name.data() + name.size() - entry.path.data());
      auto& siblings = entries_by_name[dir_ino - kRootIno];
      const auto found = siblings.find(name);
      if (found != siblings.end()) {
        const NamespaceNode& existing = ns.nodes_[found->second - kRootIno];
        if (last && !existing.is_dir()) return BadPath(entry.path, "listed twice");
        if (last || !existing.is_dir()) {
          return BadPath(entry.path,
                         "\"" + existing.path + "\" would be both a file and a directory");
        }
        dir_ino = found->second;
        continue;
      }
      const uint64_t ino = ns.nodes_.size() + kRootIno;
      siblings.emplace(std::string(name), ino);
      ns.nodes_.push_back(NamespaceNode{std::string(name), entry.path.substr(0, prefix_bytes),
                                        dir_ino, {}, last ? entry.content : nullptr});
      entries_by_name.emplace_back();
      dir_ino = ino;
    }
    const uint64_t size_bytes = entry.content->size();
    if (size_bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
      return BadPath(entry.path, "size " + std::to_string(size_bytes) + " does not fit off_t");
    }
    ns.total_file_bytes_ = size_bytes > UINT64_MAX - ns.total_file_bytes_
                               ? UINT64_MAX
                               : ns.total_file_bytes_ + size_bytes;
  }

  for (size_t index = 0; index < ns.nodes_.size(); ++index) {
    for (const auto& [name, ino] : entries_by_name[index]) ns.nodes_[index].children.push_back(ino);
  }
  clock_gettime(CLOCK_REALTIME, &ns.build_time_);
  ns.uid_ = getuid();
  ns.gid_ = getgid();
  return ns;
}

const NamespaceNode* Namespace::Find(uint64_t ino) const {
  if (ino < kRootIno || ino - kRootIno >= nodes_.size()) return nullptr;
  return &nodes_[ino - kRootIno];
}

std::optional<uint64_t> Namespace::Lookup(uint64_t parent_ino, std::string_view name) const {
  const NamespaceNode* parent = Find(parent_ino);
  if (parent == nullptr || !parent->is_dir()) return std::nullopt;
  const auto& children = parent->children;
  const auto it = std::lower_bound(children.begin(), children.end(), name,
                                   [this](uint64_t child, std::string_view wanted) {
                                     return nodes_[child - kRootIno].name < wanted;
                                   });
  if (it == children.end() || nodes_[*it - kRootIno].name != name) return std::nullopt;
  return *it;
}

std::optional<struct stat> Namespace::Attributes(uint64_t ino) const {
  const NamespaceNode* node = Find(ino);
  if (node == nullptr) return std::nullopt;
  struct stat st {};
  st.st_ino = ino;
  if (node->is_dir()) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2 + std::count_if(node->children.begin(), node->children.end(),
                                    [this](uint64_t child) { return Find(child)->is_dir(); });
  } else {
    st.st_mode = S_IFREG | 0444;
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(node->content->size());
    st.st_blocks = static_cast<blkcnt_t>(node->content->size() / 512 + (node->content->size() % 512 != 0));
  }
  st.st_blksize = static_cast<blksize_t>(kPreferredIoBytes);
  st.st_uid = uid_;
  st.st_gid = gid_;
  st.st_atim = st.st_mtim = st.st_ctim = build_time_;
  return st;
}

}  // namespace reshard::fs
