"""plan, materialize and mount from Python: the `reshardfs` commands of the same names, with the target layout
as keyword arguments that mirror the flags (tp=, dp=, zero_stage=, lp_dtype=, ds_config=, model_config=,
padded_vocab=, tag=). Each runs the packaged program, so the result is byte for byte what the command gives;
a refusal raises ReshardfsError with the program's one error line.

    with reshardfs.mount("/ckpt/run1", "/mnt/run1", ds_config="ds_config.json") as mounted:
        engine.load_checkpoint(mounted.path)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from reshardfs._binary import ReshardfsError, run, target_flags

__all__ = ["plan", "materialize", "mount", "Mount"]


def plan(src: str | os.PathLike, **target: Any) -> dict[str, Any]:
    """What `reshardfs plan SRC --json` prints, parsed: the files the target layout would serve (names, sizes,
    what each holds) and what each rank reads."""
    return json.loads(run(["plan", os.fspath(src), "--json", *target_flags(target)], quiet=True))


def materialize(src: str | os.PathLike, dst: str | os.PathLike, quiet: bool = False, **target: Any) -> Path:
    """Writes the target layout's checkpoint to `dst` (a new or empty folder), byte for byte what `mount` serves,
    and returns `dst`. Progress goes to stderr unless `quiet`. A failed run leaves no file that looks complete."""
    flags = ["--quiet"] if quiet else []
    run(["materialize", os.fspath(src), os.fspath(dst), *flags, *target_flags(target)], quiet=quiet)
    return Path(dst)


class Mount:
    """A reshardfs mount this process made. Unmounts on `unmount()` or at the end of a `with` block (an exception
    included); dropping the object does not unmount (a mount may outlive the process, as the command's does)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def mounted(self) -> bool:
        return os.path.ismount(self.path)

    def unmount(self) -> None:
        """Unmounts it (waiting for nothing: the kernel finishes reads in flight first); a second call does
        nothing."""
        if self.mounted:
            run(["umount", os.fspath(self.path)], quiet=True)

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.unmount()

    def __repr__(self) -> str:
        return f"Mount({str(self.path)!r}, mounted={self.mounted})"


def mount(src: str | os.PathLike, mountpoint: str | os.PathLike, quiet: bool = False, **options: Any) -> Mount:
    """Mounts the universal checkpoint `src` at `mountpoint` (an existing empty folder) as the native checkpoint
    of the target layout and returns once the mount is ready; the server runs on in the background. Besides the
    target keywords: max_threads=, direct_io=True, single_threaded=True, fuse_options=["allow_other", ...].
    Planning happens before anything is mounted: a refusal raises ReshardfsError and leaves nothing mounted."""
    path = Path(mountpoint).resolve()
    run(["mount", os.fspath(src), os.fspath(path), *target_flags(options, serve=True)], quiet=quiet)
    if not os.path.ismount(path):
        raise ReshardfsError(["mount", os.fspath(src), os.fspath(path)], 0,
                             f"reshardfs: error: {path}: the mount command succeeded but nothing is mounted there")
    return Mount(path)
