#include "reshard/base/folder_entries.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace reshard {

Result<std::vector<FolderEntry>> ListFolder(int dir_fd, const std::string& path) {
  std::vector<FolderEntry> out;
  alignas(alignof(struct dirent64)) char buffer[8192];
  for (;;) {
    const ssize_t n = ::getdents64(dir_fd, buffer, sizeof buffer);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": cannot list", errno);
    }
    if (n == 0) return out;
    for (ssize_t pos = 0; pos < n;) {
      const auto* d = reinterpret_cast<const struct dirent64*>(buffer + pos);
      pos += d->d_reclen;
      if (std::strcmp(d->d_name, ".") == 0 || std::strcmp(d->d_name, "..") == 0) continue;
      FolderEntry entry{d->d_name, d->d_type == DT_REG};
      // Only a link (or a file system that does not say) needs a stat: what it points to counts.
      if (d->d_type == DT_LNK || d->d_type == DT_UNKNOWN) {
        struct stat st {};
        entry.regular = ::fstatat(dir_fd, d->d_name, &st, 0) == 0 && S_ISREG(st.st_mode);
      }
      out.push_back(std::move(entry));
    }
  }
}

}  // namespace reshard
