// The libfuse low-level server: one rs_<op> trampoline per fuse_lowlevel_ops field, each sending
// exactly one reply, and Serve()'s session lifecycle held by RAII guards.
#define FUSE_USE_VERSION 312

#include "fs/fuse_server.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string_view>

#include <spdlog/spdlog.h>

#include "reshard/base/unique_fd.h"

namespace reshard::fs {
namespace {

static_assert(FUSE_ROOT_ID == kRootIno, "Namespace's root must be FUSE's root inode");

// The largest request: libfuse 3.14 caps max_write at its 1 MiB buffer and derives the kernel's
// max_pages from it, which bounds read requests as well.
constexpr unsigned kMaxRequestBytes = 1u << 20;

// What every callback reaches through fuse_req_userdata(); read-only while serving.
struct Server {
  const Namespace& ns;
  double timeout_s;
  bool direct_io;
};

const Server& ServerOf(fuse_req_t req) {
  return *static_cast<const Server*>(fuse_req_userdata(req));
}

// One reply buffer per worker thread, grown to the largest request seen and then reused, so a
// warm read path allocates nothing. A thread serves one request at a time and fuse_reply_buf()
// has copied the bytes to the kernel when it returns, so the buffer is free again afterwards.
uint8_t* ReplyBuffer(size_t size) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < size) buffer.resize(size);
  return buffer.data();
}

// Runs a callback body that sends exactly one reply. An exception escaping into libfuse would
// end the whole mount, so one (bad_alloc growing the buffer, say) fails just this request. The
// bodies only throw before they reply, so the EIO reply is never a second one.
template <typename Body>
void Guarded(fuse_req_t req, const char* op, Body&& body) noexcept {
  try {
    body();
  } catch (const std::exception& error) {
    spdlog::error("{}: {}", op, error.what());
    fuse_reply_err(req, EIO);
  } catch (...) {
    spdlog::error("{}: unknown exception", op);
    fuse_reply_err(req, EIO);
  }
}

void rs_init(void* /*userdata*/, fuse_conn_info* conn) {
  conn->max_write = kMaxRequestBytes;
  // conn->max_readahead already holds the kernel's offer (libfuse starts from UINT_MAX and takes
  // the minimum), the largest it accepts. FUSE_CAP_ASYNC_READ stays on (libfuse's default):
  // readahead requests may then overlap and run on several worker threads. Replies go through
  // fuse_reply_buf (one writev), so FUSE_CAP_SPLICE_WRITE, which only fuse_reply_data uses,
  // would add nothing.
  //
  // Contents never change while mounted, so the kernel need not drop cached pages when it sees
  // attributes again.
  conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

void rs_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guarded(req, "lookup", [&] {
    const Server& server = ServerOf(req);
    fuse_entry_param entry{};
    entry.entry_timeout = server.timeout_s;
    entry.attr_timeout = server.timeout_s;
    // A missing name is answered as ino 0 with a timeout, which the kernel caches as a
    // negative entry: the tree never gains files, so asking again is pointless.
    if (const std::optional<uint64_t> ino = server.ns.Lookup(parent, name)) {
      entry.ino = *ino;
      entry.attr = *server.ns.Attributes(*ino);
    }
    fuse_reply_entry(req, &entry);
  });
}

void rs_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* /*fi*/) {
  Guarded(req, "getattr", [&] {
    const Server& server = ServerOf(req);
    const std::optional<struct stat> attributes = server.ns.Attributes(ino);
    if (!attributes) {
      fuse_reply_err(req, ENOENT);
      return;
    }
    fuse_reply_attr(req, &*attributes, server.timeout_s);
  });
}

void rs_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guarded(req, "open", [&] {
    const Server& server = ServerOf(req);
    const NamespaceNode* node = server.ns.Find(ino);
    if (node == nullptr || node->is_dir()) {
      fuse_reply_err(req, node == nullptr ? ENOENT : EISDIR);
      return;
    }
    // The ro mount makes the kernel refuse these first; this holds even if a user -o rw
    // undid that.
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC) != 0) {
      fuse_reply_err(req, EROFS);
      return;
    }
    if (const Status check = node->content->CheckOpen(); !check.ok()) {
      spdlog::warn("{}: open refused: {}", node->path, check.message());
      fuse_reply_err(req, EIO);
      return;
    }
    fi->direct_io = server.direct_io;
    fi->keep_cache = !server.direct_io;  // immutable contents: cached pages stay valid
    fi->noflush = 1;                     // nothing to flush on close; saves a request
    fuse_reply_open(req, fi);
  });
}

void rs_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* /*fi*/) {
  Guarded(req, "read", [&] {
    const NamespaceNode* node = ServerOf(req).ns.Find(ino);
    if (node == nullptr || node->is_dir() || offset < 0) {
      fuse_reply_err(req, node == nullptr ? ENOENT : node->is_dir() ? EISDIR : EINVAL);
      return;
    }
    const FileContent& content = *node->content;
    const uint64_t start = static_cast<uint64_t>(offset);
    // Clamped first, so reads at the end of a file do not grow the buffer.
    const size_t length = start >= content.size() ? 0 : std::min<uint64_t>(size, content.size() - start);
    uint8_t* buffer = ReplyBuffer(length);
    const Result<size_t> count = content.Read(start, buffer, length);
    if (!count.ok()) {
      spdlog::warn("{}: read of {} bytes at offset {} failed: {}", node->path, length, start,
                   count.status().message());
      fuse_reply_err(req, EIO);
      return;
    }
    fuse_reply_buf(req, reinterpret_cast<const char*>(buffer), *count);
  });
}

void rs_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guarded(req, "opendir", [&] {
    const NamespaceNode* node = ServerOf(req).ns.Find(ino);
    if (node == nullptr || !node->is_dir()) {
      fuse_reply_err(req, node == nullptr ? ENOENT : ENOTDIR);
      return;
    }
    // Listings never change: the kernel may cache them and keep that cache across opens.
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
    fuse_reply_open(req, fi);
  });
}

// Directory offsets: 0 is ".", 1 is "..", 2 + i is children[i]; an entry's offset cookie is
// the position of the entry after it.
void rs_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* /*fi*/) {
  Guarded(req, "readdir", [&] {
    const Namespace& ns = ServerOf(req).ns;
    const NamespaceNode* node = ns.Find(ino);
    if (node == nullptr || !node->is_dir() || offset < 0) {
      fuse_reply_err(req, node == nullptr ? ENOENT : !node->is_dir() ? ENOTDIR : EINVAL);
      return;
    }
    char* buffer = reinterpret_cast<char*>(ReplyBuffer(size));
    size_t used = 0;
    const uint64_t entry_count = 2 + node->children.size();
    for (uint64_t index = static_cast<uint64_t>(offset); index < entry_count; ++index) {
      const uint64_t entry_ino = index == 0 ? ino : index == 1 ? node->parent_ino : node->children[index - 2];
      const NamespaceNode& entry = *ns.Find(entry_ino);
      const char* name = index == 0 ? "." : index == 1 ? ".." : entry.name.c_str();
      struct stat st {};  // fuse_add_direntry uses only the ino and the file type
      st.st_ino = entry_ino;
      st.st_mode = entry.is_dir() ? S_IFDIR : S_IFREG;
      const size_t needed = fuse_add_direntry(req, buffer + used, size - used, name, &st,
                                              static_cast<off_t>(index + 1));
      if (needed > size - used) break;
      used += needed;
    }
    fuse_reply_buf(req, buffer, used);
  });
}

void rs_statfs(fuse_req_t req, fuse_ino_t /*ino*/) {
  Guarded(req, "statfs", [&] {
    const Namespace& ns = ServerOf(req).ns;
    struct statvfs st {};
    st.f_bsize = Namespace::kPreferredIoBytes;
    st.f_frsize = 4096;
    st.f_blocks = ns.total_file_bytes() / st.f_frsize + (ns.total_file_bytes() % st.f_frsize != 0);
    st.f_files = ns.inode_count();
    st.f_namemax = NAME_MAX;
    fuse_reply_statfs(req, &st);
  });
}

fuse_lowlevel_ops Operations() {
  fuse_lowlevel_ops ops{};
  ops.init = rs_init;
  ops.lookup = rs_lookup;
  ops.getattr = rs_getattr;
  ops.open = rs_open;
  ops.read = rs_read;
  ops.opendir = rs_opendir;
  ops.readdir = rs_readdir;
  ops.statfs = rs_statfs;
  // Left to libfuse: forget (nothing is counted, see namespace.h), release and releasedir
  // (no per-open state), flush (noflush), access (default_permissions).
  return ops;
}

// ---- libfuse's log messages -----------------------------------------------------------------

// While Serve() sets up, libfuse's complaints ("fuse: unknown option(s): ...") are collected
// here so that the returned Status carries them and the CLI prints one error line, not two.
// Setup runs before any worker thread exists; the atomic only makes that independent of timing.
std::atomic<std::string*> g_setup_messages{nullptr};

void ForwardFuseLog(fuse_log_level level, const char* format, va_list args) {
  char text[1024];
  std::vsnprintf(text, sizeof text, format, args);
  std::string* setup = g_setup_messages.load();
  // Kept verbatim: libfuse builds some lines from several calls ("unknown option(s): `", "-o ").
  if (setup != nullptr && level <= FUSE_LOG_WARNING) {
    *setup += text;
    return;
  }
  std::string_view message = text;
  while (!message.empty() && message.back() == '\n') message.remove_suffix(1);
  switch (level) {
    case FUSE_LOG_EMERG:
    case FUSE_LOG_ALERT:
    case FUSE_LOG_CRIT:
    case FUSE_LOG_ERR:
      spdlog::error("libfuse: {}", message);
      break;
    case FUSE_LOG_WARNING:
      spdlog::warn("libfuse: {}", message);
      break;
    case FUSE_LOG_NOTICE:
    case FUSE_LOG_INFO:
      spdlog::info("libfuse: {}", message);
      break;
    case FUSE_LOG_DEBUG:
      spdlog::debug("libfuse: {}", message);
      break;
  }
}

// Routes libfuse's log to ForwardFuseLog for its lifetime, collecting setup messages until
// StopCollecting(); restores libfuse's default sink (stderr) at the end.
class FuseLogRoute {
 public:
  FuseLogRoute() {
    g_setup_messages.store(&setup_);
    fuse_set_log_func(ForwardFuseLog);
  }
  ~FuseLogRoute() {
    fuse_set_log_func(nullptr);
    g_setup_messages.store(nullptr);
  }
  FuseLogRoute(const FuseLogRoute&) = delete;
  FuseLogRoute& operator=(const FuseLogRoute&) = delete;

  void StopCollecting() { g_setup_messages.store(nullptr); }
  // What libfuse said so far on one line ("; " between its lines), or `fallback` if nothing.
  std::string Explanation(const char* fallback) const {
    std::string joined;
    std::istringstream lines(setup_);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      if (!joined.empty()) joined += "; ";
      joined += line;
    }
    return joined.empty() ? fallback : joined;
  }

 private:
  std::string setup_;
};

// ---- the session ----------------------------------------------------------------------------

// The argv handed to fuse_session_new: ours first, then the user's -o values (so a user
// fsname= wins), then "ro", last so that nothing turns it off.
class FuseArgs {
 public:
  explicit FuseArgs(const std::vector<std::string>& user_options) {
    strings_ = {"reshardfs", "-o", "fsname=reshardfs,subtype=reshardfs,default_permissions"};
    for (const std::string& option : user_options) {
      strings_.push_back("-o");
      strings_.push_back(option);
    }
    strings_.push_back("-o");
    strings_.push_back("ro");
    for (std::string& s : strings_) argv_.push_back(s.data());
    args_ = FUSE_ARGS_INIT(static_cast<int>(argv_.size()), argv_.data());
  }
  // fuse_session_new may replace the vector with an allocated copy; this frees only that.
  ~FuseArgs() { fuse_opt_free_args(&args_); }
  FuseArgs(const FuseArgs&) = delete;
  FuseArgs& operator=(const FuseArgs&) = delete;

  fuse_args* get() { return &args_; }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> argv_;
  fuse_args args_{};
};

// Owns a fuse_session and undoes, in reverse order, each step that succeeded.
class SessionGuard {
 public:
  explicit SessionGuard(fuse_session* session) : session_(session) {}
  ~SessionGuard() {
    if (mounted_) fuse_session_unmount(session_);  // a no-op if already unmounted from outside
    if (signals_) fuse_remove_signal_handlers(session_);
    fuse_session_destroy(session_);
  }
  SessionGuard(const SessionGuard&) = delete;
  SessionGuard& operator=(const SessionGuard&) = delete;

  bool InstallSignalHandlers() { return signals_ = fuse_set_signal_handlers(session_) == 0; }
  bool Mount(const std::string& mountpoint) {
    return mounted_ = fuse_session_mount(session_, mountpoint.c_str()) == 0;
  }
  fuse_session* get() const { return session_; }

 private:
  fuse_session* const session_;
  bool signals_ = false;
  bool mounted_ = false;
};

// The mountpoint as an absolute, symlink-free path: libfuse keeps the string it mounted and
// unmounts by it later, after the background child has moved to "/".
Result<std::string> ResolveMountpoint(const std::string& mountpoint) {
  if (mountpoint.empty()) return InvalidArgument("no mountpoint given");
  std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(mountpoint.c_str(), nullptr),
                                                       &std::free);
  if (resolved == nullptr) return ErrnoError("mountpoint " + mountpoint, errno);
  struct stat st {};
  if (::stat(resolved.get(), &st) != 0) return ErrnoError("mountpoint " + mountpoint, errno);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument("mountpoint " + mountpoint + ": not a directory");
  return std::string(resolved.get());
}

// Returns fuse_session_loop_mt's result: 0, -errno, or the signal that ended it.
int LoopMultithreaded(fuse_session* session, unsigned max_threads) {
  std::unique_ptr<fuse_loop_config, decltype(&fuse_loop_cfg_destroy)> config(
      fuse_loop_cfg_create(), &fuse_loop_cfg_destroy);
  fuse_loop_cfg_set_max_threads(config.get(), max_threads);
  return fuse_session_loop_mt(session, config.get());
}

// ---- unmounting -----------------------------------------------------------------------------

// `path` made absolute with its parent resolved, without touching `path` itself: stat() on a
// mount whose server died fails (ENOTCONN), and such a mount must still be unmountable.
Result<std::string> AbsoluteMountpoint(const std::string& path) {
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(path, error).lexically_normal();
  if (error) return ErrnoError(path, error.value());
  if (!absolute.has_filename()) absolute = absolute.parent_path();  // "mnt/" -> "mnt"
  const std::filesystem::path parent = std::filesystem::canonical(absolute.parent_path(), error);
  if (error) return ErrnoError(path, error.value());
  return (parent / absolute.filename()).lexically_normal().string();
}

// /proc/self/mountinfo writes space, tab, newline and backslash in paths as \ooo (octal).
std::string UnescapeMountinfo(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    const auto is_octal = [](char c) { return c >= '0' && c <= '7'; };
    if (field[i] == '\\' && i + 3 < field.size() &&
        std::all_of(field.begin() + i + 1, field.begin() + i + 4, is_octal)) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

// The filesystem type of the topmost mount at `mountpoint` (an absolute path), or nullopt.
Result<std::optional<std::string>> MountedType(const std::string& mountpoint) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  if (!mountinfo) return IoError("cannot read /proc/self/mountinfo");
  std::optional<std::string> type;
  std::string line;
  // "36 35 98:0 /root /mnt/point rw,noatime master:1 - fuse.reshardfs reshardfs ro,..."
  while (std::getline(mountinfo, line)) {
    std::istringstream fields(line);
    std::string id, parent_id, device, root, mounted_at;
    fields >> id >> parent_id >> device >> root >> mounted_at;
    const size_t separator = line.find(" - ");
    if (separator == std::string::npos || UnescapeMountinfo(mounted_at) != mountpoint) continue;
    std::istringstream tail(line.substr(separator + 3));
    std::string fs_type;
    tail >> fs_type;
    type = fs_type;  // later lines are mounted on top of earlier ones
  }
  return type;
}

// Runs `fusermount3 -u -- mountpoint`; its output becomes the message when it fails.
Status RunFusermountUnmount(const std::string& mountpoint) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoError("pipe", errno);
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDERR_FILENO);
  const char* argv[] = {"fusermount3", "-u", "--", mountpoint.c_str(), nullptr};
  pid_t pid = 0;
  const int spawn_error = ::posix_spawnp(&pid, argv[0], &actions, nullptr,
                                         const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error != 0) return ErrnoError("cannot run fusermount3", spawn_error);
  write_end = UniqueFd();  // only the child holds the write end now, so EOF means it is done

  std::string output;
  char chunk[512];
  while (true) {
    const ssize_t n = ::read(read_end.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(chunk, static_cast<size_t>(n));
  }
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, 0) < 0) {
    if (errno != EINTR) return ErrnoError("waitpid fusermount3", errno);
  }
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) return Status::Ok();
  std::replace(output.begin(), output.end(), '\n', ' ');
  while (!output.empty() && output.back() == ' ') output.pop_back();
  return IoError(mountpoint + ": fusermount3 -u failed" + (output.empty() ? "" : ": " + output));
}

// A mount over a mount or over files would hide them (and FUSE allows both): refused.
Status CheckMountpointFree(const std::string& given, const std::string& mountpoint) {
  RS_ASSIGN_OR_RETURN(const std::optional<std::string> type, MountedType(mountpoint));
  if (type) return InvalidArgument("mountpoint " + given + ": already mounted (" + *type + "); unmount it first");
  std::error_code error;
  const auto entries = std::filesystem::directory_iterator(mountpoint, error);
  if (error) return ErrnoError("mountpoint " + given, error.value());
  if (entries != std::filesystem::directory_iterator()) {
    return InvalidArgument("mountpoint " + given + ": not empty (the mount would hide what it holds)");
  }
  return Status::Ok();
}

}  // namespace

Status Serve(const Namespace& ns, const ServeOptions& options) {
  RS_ASSIGN_OR_RETURN(const std::string mountpoint, ResolveMountpoint(options.mountpoint));
  RS_RETURN_IF_ERROR(CheckMountpointFree(options.mountpoint, mountpoint));
  if (!options.single_threaded && options.max_threads == 0) {
    return InvalidArgument("max threads must be at least 1");
  }
  if (!(options.attr_timeout_s >= 0)) {
    return InvalidArgument("attribute timeout must be >= 0 seconds");
  }
  FuseLogRoute log;
  FuseArgs args(options.fuse_options);
  const fuse_lowlevel_ops ops = Operations();
  Server server{ns, options.attr_timeout_s, options.direct_io};
  fuse_session* session = fuse_session_new(args.get(), &ops, sizeof ops, &server);
  if (session == nullptr) {
    return InvalidArgument("cannot start a FUSE session: " + log.Explanation("fuse_session_new failed"));
  }
  SessionGuard guard(session);
  if (!guard.InstallSignalHandlers()) {
    return Internal("cannot install signal handlers: " + log.Explanation("fuse_set_signal_handlers failed"));
  }
  if (!guard.Mount(mountpoint)) {
    return IoError("cannot mount at " + mountpoint + ": " + log.Explanation("fuse_session_mount failed"));
  }
  log.StopCollecting();
  spdlog::debug("serving {} inodes at {}", ns.inode_count(), mountpoint);
  // Only now, so every error above reached the caller's terminal and exit status.
  if (!options.foreground && fuse_daemonize(/*foreground=*/0) != 0) {
    return IoError("cannot detach into the background");
  }
  const int result = options.single_threaded ? fuse_session_loop(session)
                                             : LoopMultithreaded(session, options.max_threads);
  if (result < 0) return ErrnoError("serving " + mountpoint, -result);
  return Status::Ok();
}

Status Unmount(const std::string& mountpoint) {
  RS_ASSIGN_OR_RETURN(const std::string absolute, AbsoluteMountpoint(mountpoint));
  RS_ASSIGN_OR_RETURN(const std::optional<std::string> type, MountedType(absolute));
  if (!type) return NotFound(mountpoint + ": not mounted");
  if (*type != "fuse.reshardfs") {
    return InvalidArgument(mountpoint + ": not a reshardfs mount (it is " + *type + ")");
  }
  return RunFusermountUnmount(absolute);
}

}  // namespace reshard::fs
