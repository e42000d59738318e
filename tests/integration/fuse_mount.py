"""Starting and stopping reshardfs FUSE servers in tests: one implementation for every test that mounts.

A server runs in the foreground (`-f`) as a child process with its output in a file; start_server waits
until the mountpoint is mounted (or the process died) and stop_server unmounts (fusermount3 -u, then -u -z)
and reaps it, so a failing test leaves no mount or process behind.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
MOUNT_TIMEOUT_S = 30  # planning a checkpoint happens before the mount
EXIT_TIMEOUT_S = 10

requires_fuse = pytest.mark.skipif(
    not (os.access("/dev/fuse", os.R_OK | os.W_OK) and shutil.which("fusermount3")),
    reason="needs a usable /dev/fuse and fusermount3",
)


def unmount(mountpoint: Path) -> None:
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, check=False)
    if os.path.ismount(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True, check=False)


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Server:
    """One `reshardfs <subcommand> ... MOUNTPOINT -f` process."""

    def __init__(self, process: subprocess.Popen, mountpoint: Path, log_path: Path, mode: str = "default") -> None:
        self.process = process
        self.mountpoint = mountpoint
        self.log_path = log_path
        self.mode = mode

    def stderr(self) -> str:
        """Everything the server printed (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def wait(self) -> int:
        """The exit status; a server still running after EXIT_TIMEOUT_S fails the test with its threads' stacks, so
        that a hang seen once (a SIGINT not ending the loop, seen once in a --full run) can be diagnosed."""
        try:
            return self.process.wait(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stacks = thread_stacks(self.process.pid)
            pytest.fail(f"the server did not exit within {EXIT_TIMEOUT_S} s; its threads:\n{stacks}\n"
                        f"its output:\n{self.stderr()}")


def thread_stacks(pid: int) -> str:
    """Every thread's backtrace of process `pid` (gdb, attached in batch mode), or why there is none."""
    if shutil.which("gdb") is None:
        return "(no gdb on this machine)"
    done = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"], capture_output=True,
                          text=True, timeout=60, check=False)
    return done.stdout[-12000:] or done.stderr[-2000:]


def start_server(argv: Sequence[object], mountpoint: Path, log_path: Path, mode: str = "default") -> Server:
    """Runs `argv` (a reshardfs command serving `mountpoint` in the foreground) and waits for the mount;
    fails the test with the server's output when it exits or does not mount in time."""
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    server = Server(process, mountpoint, log_path, mode)
    if not wait_for(lambda: os.path.ismount(mountpoint) or process.poll() is not None, MOUNT_TIMEOUT_S):
        stop_server(server)
        pytest.fail(f"not mounted after {MOUNT_TIMEOUT_S} s: {server.stderr()}")
    if process.poll() is not None:
        pytest.fail(f"server exited with {process.returncode} before mounting: {server.stderr()}")
    return server


def stop_server(server: Server) -> int:
    """Unmounts and reaps the server; returns its exit status (killed if it does not exit)."""
    unmount(server.mountpoint)
    try:
        return server.process.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


def served_while(argv: Sequence[object], mountpoint: Path, log_path: Path, body: Callable[[], T]) -> T:
    """Runs body() while the server started by `argv` serves `mountpoint`, then stops it; raises RuntimeError with
    the server's output when it does not exit 0 (a resume that passed over a crashed server does not count)."""
    server = start_server(argv, mountpoint, log_path)
    try:
        result = body()
    finally:
        rc = stop_server(server)
    if rc != 0:
        raise RuntimeError(f"the reshardfs server exited with {rc}: {server.stderr()}")
    return result


def concurrent_read_mismatches(expected: dict[Path, bytes], threads: int = 8, reads: int = 100,
                               max_length: int | None = None) -> list[str]:
    """`threads` readers each pread `reads` random ranges of random files of `expected` (path -> the bytes
    a sequential read gave) at once; returns one line per range that differed or read that failed."""
    paths = sorted(expected)
    failures: list[str] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        fds = {p: os.open(p, os.O_RDONLY) for p in paths}
        try:
            for _ in range(reads):
                path = rng.choice(paths)
                size = len(expected[path])
                offset, length = rng.randrange(max(size, 1)), rng.randrange(1, (max_length or size) + 1)
                if os.pread(fds[path], length, offset) != expected[path][offset : offset + length]:
                    failures.append(f"thread {seed}: {path.name} range ({offset}, {length}) differs")
        except OSError as error:
            failures.append(f"thread {seed}: {error}")
        finally:
            for fd in fds.values():
                os.close(fd)

    workers = [threading.Thread(target=reader, args=(seed,)) for seed in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return failures
