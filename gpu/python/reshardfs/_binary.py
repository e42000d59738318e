"""The packaged `reshardfs` command-line program: where it is, how keyword targets become its flags, and how
its failures become Python exceptions (the one place they are converted).

The program is looked for, in order, at $RESHARDFS_BINARY, then inside this package (`_bin/reshardfs`: the
wheel installs it there, and the CMake build copies it there beside the extension). It is never looked up on
PATH: the wheel's `reshardfs` console script is on PATH and only forwards to the packaged program.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["ReshardfsError", "binary", "target_flags", "run"]


class ReshardfsError(RuntimeError):
    """A `reshardfs` command failed. The message is the program's own error line; `returncode`, `argv` and
    `stderr` tell the rest."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        lines = [line for line in stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("reshardfs: error: ")]
        reason = (errors[-1].removeprefix("reshardfs: error: ") if errors else
                  lines[0] if lines else f"exited with status {returncode} and printed nothing")
        super().__init__(reason)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


def binary() -> Path:
    """The `reshardfs` program this package runs; FileNotFoundError when it is not there."""
    override = os.environ.get("RESHARDFS_BINARY")
    path = Path(override) if override else Path(__file__).resolve().parent / "_bin" / "reshardfs"
    if not (path.is_file() and os.access(path, os.X_OK)):
        where = "$RESHARDFS_BINARY" if override else "the reshardfs package"
        raise FileNotFoundError(f"{path}: no executable reshardfs program ({where}); install the wheel "
                                "(pip install .) or build with scripts/build.sh")
    return path


# The keyword arguments of plan/materialize/mount/verify and the flags they stand for. Values are given as
# the CLI takes them (ints, "bf16", paths); None leaves a flag out.
_TARGET_FLAGS = {
    "tp": "--tp",
    "dp": "--dp",
    "zero_stage": "--zero-stage",
    "lp_dtype": "--lp-dtype",
    "ds_config": "--ds-config",
    "model_config": "--model-config",
    "padded_vocab": "--padded-vocab",
    "tag": "--tag",
}
_SERVE_FLAGS = {"max_threads": "--max-threads"}
_SERVE_SWITCHES = {"direct_io": "--direct-io", "single_threaded": "--single-threaded"}


def target_flags(options: Mapping[str, Any], serve: bool = False) -> list[str]:
    """The command-line flags for keyword `options`: target flags, and with `serve` the mount's serve flags
    (max_threads=, direct_io=, single_threaded=, fuse_options=[...]). TypeError names an unknown keyword."""
    valued = dict(_TARGET_FLAGS, **(_SERVE_FLAGS if serve else {}))
    switches = _SERVE_SWITCHES if serve else {}
    known = set(valued) | set(switches) | ({"fuse_options"} if serve else set())
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unknown target option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    argv: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        if key in switches:
            if value is not True:
                raise TypeError(f"{key}= takes True or False, not {value!r}")
            argv.append(switches[key])
        elif key == "fuse_options":
            for option in [value] if isinstance(value, str) else value:
                argv += ["-o", str(option)]
        else:
            if isinstance(value, bool):
                raise TypeError(f"{key}= takes a value, not {value!r}")
            argv += [valued[key], os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return argv


def run(args: Sequence[str], quiet: bool = False) -> str:
    """Runs `reshardfs ARGS...` to its end and returns what it printed on stdout. Its stderr (logs, progress
    lines) is passed on to this process's stderr as it comes, unless `quiet`; on a non-zero exit raises
    ReshardfsError with the program's error line."""
    argv = [str(binary()), *args]
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as child:
        assert child.stdout is not None and child.stderr is not None
        stdout: list[bytes] = []
        drain = threading.Thread(target=lambda: stdout.append(child.stdout.read()), daemon=True)
        drain.start()
        stderr = bytearray()
        while chunk := os.read(child.stderr.fileno(), 1 << 16):
            stderr += chunk
            if not quiet:
                sys.stderr.write(chunk.decode("utf-8", errors="replace"))
                sys.stderr.flush()
        drain.join()
        returncode = child.wait()
    if returncode != 0:
        raise ReshardfsError(argv, returncode, stderr.decode("utf-8", errors="replace"))
    return b"".join(stdout).decode("utf-8")
