"""The FUSE server mounted for real, through `reshardfs serve-null`: reads, lifecycle, refusals.

serve-null serves files null_0 .. null_{N-1} whose byte k is k % 251, so every read can be
checked without a reference file. Needs /dev/fuse and fusermount3 (skipped, with the reason,
where either is missing). Every mount is torn down by the fixtures (fusermount3 -u, then -u -z),
so a failing test leaves no mount or server behind.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fuse_mount import EXIT_TIMEOUT_S, Server, concurrent_read_mismatches, requires_fuse, start_server, stop_server, unmount, wait_for

SIZE = 3 * 2**20 + 12345  # not a multiple of pages, of FUSE requests or of the pattern's period
FILES = 3
PERIOD = 251
MODES = {"default": [], "single-threaded": ["--single-threaded"], "direct-io": ["--direct-io"]}

pytestmark = requires_fuse


def expected(offset: int, length: int) -> bytes:
    """What serve-null's files hold at [offset, offset + length), cut at the end of the file."""
    length = max(0, min(length, SIZE - offset))
    start = offset % PERIOD
    return (bytes(range(PERIOD)) * ((start + length) // PERIOD + 1))[start : start + length]


def servers_of(mountpoint: Path) -> list[int]:
    """Pids of the reshardfs processes whose command line names `mountpoint`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"reshardfs") and os.fsencode(mountpoint) in argv:
            pids.append(int(entry.name))
    return pids


@pytest.fixture
def mountpoint(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "mnt"
    path.mkdir()
    yield path
    unmount(path)
    assert not os.path.ismount(path)


@pytest.fixture
def serve(reshardfs: Path, mountpoint: Path, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """serve(mode): starts serve-null in the foreground at `mountpoint` and waits for the mount."""
    servers: list[Server] = []

    def start(mode: str = "default") -> Server:
        argv = [reshardfs, "serve-null", mountpoint, "--size", str(SIZE), "--files", str(FILES), "-f", *MODES[mode]]
        server = start_server(argv, mountpoint, tmp_path / f"server{len(servers)}.stderr", mode)
        servers.append(server)
        return server

    yield start
    for server in servers:
        stop_server(server)


@pytest.fixture(params=list(MODES))
def served(request: pytest.FixtureRequest, serve: Callable[..., Server]) -> Iterator[Server]:
    """A server in each mode; its stderr must stay empty."""
    server = serve(request.param)
    yield server
    assert server.stderr() == ""


def test_listing_and_attributes(served: Server) -> None:
    mnt = served.mountpoint
    assert sorted(os.listdir(mnt)) == [f"null_{i}" for i in range(FILES)]
    root = os.stat(mnt)
    assert stat.S_ISDIR(root.st_mode) and stat.S_IMODE(root.st_mode) == 0o555 and root.st_nlink == 2
    for i in range(FILES):
        st = os.stat(mnt / f"null_{i}")
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o444
        assert st.st_size == SIZE and st.st_nlink == 1 and st.st_blksize == 2**20
        assert st.st_uid == os.getuid()
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / "null_3")
    with pytest.raises(NotADirectoryError):
        os.listdir(mnt / "null_0")
    fs = os.statvfs(mnt)
    assert fs.f_files == FILES + 1 and fs.f_namemax == 255 and fs.f_bfree == 0
    assert fs.f_blocks * fs.f_frsize >= FILES * SIZE


def test_whole_files_and_ranges(served: Server) -> None:
    for i in range(FILES):
        assert (served.mountpoint / f"null_{i}").read_bytes() == expected(0, SIZE)
    ranges = [(0, 1), (0, 0), (250, 3), (4095, 2), (4096, 4096), (2**20 - 1, 2**20 + 2), (SIZE - 10, 100),
              (SIZE - 1, 1), (SIZE, 10), (SIZE + 5000, 10)]  # fmt: skip
    rng = random.Random(1)
    ranges += [(rng.randrange(SIZE), rng.randrange(1, 3 * 2**20)) for _ in range(40)]
    fd = os.open(served.mountpoint / "null_1", os.O_RDONLY)
    try:
        for offset, length in ranges:
            assert os.pread(fd, length, offset) == expected(offset, length), (offset, length)
    finally:
        os.close(fd)


def test_concurrent_reads_equal_a_sequential_read(served: Server) -> None:
    path = served.mountpoint / "null_2"
    sequential = path.read_bytes()
    assert sequential == expected(0, SIZE)
    assert concurrent_read_mismatches({path: sequential}, max_length=2**20 + 4096) == []


def test_mmap(served: Server) -> None:
    with open(served.mountpoint / "null_0", "rb") as f:
        if served.mode == "direct-io":
            # The kernel refuses shared mappings of direct_io files (libfuse 3.14 cannot ask for
            # FUSE_DIRECT_IO_ALLOW_MMAP); private ones work.
            with pytest.raises(OSError) as refused:
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert refused.value.errno == errno.ENODEV
            access = mmap.ACCESS_COPY
        else:
            access = mmap.ACCESS_READ
        with mmap.mmap(f.fileno(), 0, access=access) as mapped:
            assert len(mapped) == SIZE
            assert mapped[SIZE - 7 :] == expected(SIZE - 7, 7)
            assert mapped[2**20 - 3 : 2**20 + 3] == expected(2**20 - 3, 6)
            assert mapped[:] == expected(0, SIZE)


def test_writes_are_refused(served: Server) -> None:
    mnt = served.mountpoint
    refused = (errno.EROFS, errno.EACCES)
    for attempt in (
        lambda: open(mnt / "null_0", "r+b"),
        lambda: open(mnt / "null_0", "ab"),
        lambda: open(mnt / "new_file", "wb"),
        lambda: os.mkdir(mnt / "new_dir"),
        lambda: os.unlink(mnt / "null_0"),
        lambda: os.rename(mnt / "null_0", mnt / "renamed"),
        lambda: os.truncate(mnt / "null_0", 0),
    ):
        with pytest.raises(OSError) as error:
            attempt()
        assert error.value.errno in refused
    assert os.stat(mnt / "null_0").st_size == SIZE


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_unmounts_cleanly(serve: Callable[..., Server], signal_number: int) -> None:
    server = serve()
    assert (server.mountpoint / "null_0").read_bytes()[:PERIOD] == expected(0, PERIOD)
    server.process.send_signal(signal_number)
    assert server.wait() == 0
    assert not os.path.ismount(server.mountpoint)
    assert server.stderr() == ""


def test_umount_command(serve: Callable[..., Server], reshardfs: Path, run_tool) -> None:
    server = serve()
    result = run_tool(reshardfs, "umount", server.mountpoint)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result
    assert server.wait() == 0
    assert not os.path.ismount(server.mountpoint)
    assert server.stderr() == ""
    again = run_tool(reshardfs, "umount", server.mountpoint)
    assert again.returncode == 1 and again.stdout == "", again
    assert again.stderr == f"reshardfs: error: {server.mountpoint}: not mounted\n", again


def test_umount_refuses_other_filesystems(reshardfs: Path, run_tool) -> None:
    result = run_tool(reshardfs, "umount", "/proc")
    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr == "reshardfs: error: /proc: not a reshardfs mount (it is proc)\n", result


def test_background_mode_returns_once_mounted(reshardfs: Path, mountpoint: Path, run_tool) -> None:
    result = run_tool(reshardfs, "serve-null", mountpoint, "--size", SIZE, "--files", FILES)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result
    assert os.path.ismount(mountpoint)  # the parent exits only after the mount exists
    daemons = servers_of(mountpoint)
    assert len(daemons) == 1
    assert (mountpoint / "null_1").read_bytes() == expected(0, SIZE)
    result = run_tool(reshardfs, "umount", mountpoint)
    assert result.returncode == 0, result
    assert wait_for(lambda: not Path(f"/proc/{daemons[0]}/cmdline").exists() or not servers_of(mountpoint),
                    EXIT_TIMEOUT_S), "the background server did not exit after the unmount"  # fmt: skip


@pytest.mark.parametrize("foreground", [True, False], ids=["foreground", "background"])
def test_missing_mountpoint_is_one_error_line(reshardfs: Path, tmp_path: Path, run_tool, foreground: bool) -> None:
    absent = tmp_path / "absent"
    result = run_tool(reshardfs, "serve-null", absent, "--size", "1M", *(["-f"] if foreground else []))
    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr == f"reshardfs: error: mountpoint {absent}: No such file or directory\n", result
    assert not absent.exists() and not servers_of(absent)


def test_bad_fuse_option_is_one_error_line(reshardfs: Path, mountpoint: Path, run_tool) -> None:
    result = run_tool(reshardfs, "serve-null", mountpoint, "--size", "1M", "-o", "no_such_option")
    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr == ("reshardfs: error: cannot start a FUSE session: "
                             "fuse: unknown option(s): `-o no_such_option'\n"), result  # fmt: skip
    assert not os.path.ismount(mountpoint)


READ_FOREVER = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
print("reading", flush=True)
while True:
    os.pread(fd, int(sys.argv[2]), 0)
"""


def start_reader(path: Path, length: int) -> subprocess.Popen:
    """A process that reads `length` bytes of `path` at offset 0 over and over; returns once it has opened it."""
    reader = subprocess.Popen([sys.executable, "-c", READ_FOREVER, str(path), str(length)], stdout=subprocess.PIPE)
    assert reader.stdout is not None and reader.stdout.readline() == b"reading\n"
    return reader


def test_a_reader_killed_in_a_read_leaves_the_server_serving(serve: Callable[..., Server]) -> None:
    """SIGKILL to a reader whose read is in flight (direct_io: every read() is FUSE requests, 3 MiB each here): the
    kernel drops the request's reply; the server logs nothing and goes on serving every byte."""
    server = serve("direct-io")
    reader = start_reader(server.mountpoint / "null_0", SIZE)
    time.sleep(0.3)
    reader.kill()
    assert reader.wait() == -signal.SIGKILL
    assert (server.mountpoint / "null_0").read_bytes() == expected(0, SIZE)
    assert server.process.poll() is None
    assert stop_server(server) == 0
    assert server.stderr() == ""


def test_umount_while_a_reader_is_active_refuses_and_keeps_serving(serve: Callable[..., Server], reshardfs: Path,
                                                                  run_tool) -> None:
    """`reshardfs umount` while a process reads a file: one error line naming the busy mount; the reader is not
    disturbed; once it exits the same command unmounts."""
    server = serve()
    reader = start_reader(server.mountpoint / "null_1", 4096)
    try:
        busy = run_tool(reshardfs, "umount", server.mountpoint)
        assert busy.returncode == 1 and busy.stdout == "", busy
        assert busy.stderr.count("\n") == 1 and "Device or resource busy" in busy.stderr, busy
        assert busy.stderr.startswith(f"reshardfs: error: {server.mountpoint}: fusermount3 -u failed: "), busy
        assert reader.poll() is None and os.path.ismount(server.mountpoint)
    finally:
        reader.kill()
        reader.wait()
    done = run_tool(reshardfs, "umount", server.mountpoint)
    assert done.returncode == 0, done
    assert server.wait() == 0 and not os.path.ismount(server.mountpoint)


def test_umount_cleans_up_after_a_killed_server(serve: Callable[..., Server], reshardfs: Path, run_tool) -> None:
    """SIGKILL to the server leaves a dead mount ("Transport endpoint is not connected"); `reshardfs umount` removes
    it, and the folder can be mounted again."""
    server = serve()
    server.process.kill()
    assert server.wait() == -signal.SIGKILL
    with pytest.raises(OSError) as dead:
        os.stat(server.mountpoint / "null_0")
    assert dead.value.errno == errno.ENOTCONN
    result = run_tool(reshardfs, "umount", server.mountpoint)
    assert result.returncode == 0 and result.stderr == "", result
    assert not os.path.ismount(server.mountpoint) and os.listdir(server.mountpoint) == []
    again = serve()
    assert (again.mountpoint / "null_2").read_bytes()[:PERIOD] == expected(0, PERIOD)


def test_mounting_on_a_non_empty_folder_is_refused(reshardfs: Path, mountpoint: Path, run_tool) -> None:
    """The mount would hide the folder's files: refused, nothing mounted, the files untouched."""
    (mountpoint / "keep.txt").write_text("mine")
    result = run_tool(reshardfs, "serve-null", mountpoint, "--size", "1M", "-f")
    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr == (f"reshardfs: error: mountpoint {mountpoint}: not empty "
                             "(the mount would hide what it holds)\n"), result  # fmt: skip
    assert not os.path.ismount(mountpoint) and (mountpoint / "keep.txt").read_text() == "mine"


def test_mounting_on_a_mounted_folder_is_refused(serve: Callable[..., Server], reshardfs: Path, run_tool) -> None:
    """A second mount on the same folder would shadow the first: refused; the first goes on serving."""
    server = serve()
    result = run_tool(reshardfs, "serve-null", server.mountpoint, "--size", "1M", "-f")
    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr == (f"reshardfs: error: mountpoint {server.mountpoint}: already mounted (fuse.reshardfs); "
                             "unmount it first\n"), result  # fmt: skip
    assert (server.mountpoint / "null_0").read_bytes() == expected(0, SIZE)
