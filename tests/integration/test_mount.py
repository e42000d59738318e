"""`reshardfs mount` for real: the mounted checkpoint equals what `materialize` writes (whose content
tests/integration/test_served_files.py pins against DeepSpeed), under concurrent readers, mmap and faults.

Every mount runs in the foreground under fuse_mount.start_server and is torn down by the fixtures.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from checkpoint_compare import assert_same_files
from ds_reference import EXAMPLES
from fuse_mount import Server, concurrent_read_mismatches, requires_fuse, start_server, stop_server

pytestmark = requires_fuse

UCP = EXAMPLES / "tiny" / "universal"
NATIVE = EXAMPLES / "tiny" / "native"
ZERO3_UCP = EXAMPLES.parent / "tests" / "fixtures" / "tiny_zero3" / "universal"
TAG = "global_step3"

LAYOUTS = {
    "zero1_dp2_same_layout": (UCP, ["--dp", "2"]),
    "zero1_dp2_to_dp4_bf16": (UCP, ["--dp", "4", "--lp-dtype", "bf16"]),
    "zero1_to_zero3_dp2_to_dp3": (UCP, ["--dp", "3", "--zero-stage", "3"]),
    "zero3_dp2_to_dp4_fp16": (ZERO3_UCP, ["--dp", "4", "--lp-dtype", "fp16"]),
}


@pytest.fixture
def mount(reshardfs: Path, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """mount(ucp, *flags): `reshardfs mount ucp MNT *flags -f`, mounted; unmounted after the test."""
    servers: list[Server] = []

    def start(ucp: Path, *flags: str) -> Server:
        mnt = tmp_path / f"mnt{len(servers)}"
        mnt.mkdir()
        server = start_server([reshardfs, "mount", ucp, mnt, *flags, "-f"], mnt, tmp_path / f"mount{len(servers)}.log")
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert stop_server(server) == 0, server.stderr()


def materialized(reshardfs: Path, run_tool, ucp: Path, out: Path, *flags: str) -> Path:
    result = run_tool(reshardfs, "materialize", ucp, out, *flags)
    assert result.returncode == 0, result
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mount_serves_the_materialized_bytes(layout: str, mount, reshardfs: Path, run_tool, tmp_path: Path) -> None:
    ucp, flags = LAYOUTS[layout]
    server = mount(ucp, *flags)
    expected = tree_bytes(materialized(reshardfs, run_tool, ucp, tmp_path / "materialized", *flags))
    served = tree_bytes(server.mountpoint)
    assert sorted(served) == sorted(expected)
    for name, data in expected.items():
        assert served[name] == data, f"{name}: served bytes differ from materialize's"
        assert os.stat(server.mountpoint / name).st_size == len(data)


def test_round_trip_through_the_mount_with_mmap(mount) -> None:
    server = mount(UCP)
    assert (server.mountpoint / "latest").read_text() == TAG
    assert_same_files(server.mountpoint / TAG, NATIVE / TAG, mmap=True)
    assert_same_files(server.mountpoint / TAG, NATIVE / TAG, mmap=False)


def test_concurrent_random_reads_equal_sequential_reads(mount) -> None:
    """16 threads read random ranges of every file at once and get exactly the bytes of a sequential read."""
    server = mount(UCP, "--dp", "4", "--lp-dtype", "bf16")
    files = sorted(p for p in server.mountpoint.rglob("*.pt"))
    sequential = {p: p.read_bytes() for p in files}
    assert concurrent_read_mismatches(sequential, threads=16, reads=200) == []


def copy_ucp(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(UCP, run)
    return run


def test_run_folder_files_pass_through(mount, tmp_path: Path) -> None:
    run = copy_ucp(tmp_path)
    (run / "trainer_state.json").write_text('{"global_step": 3}')
    (run / "latest").write_text("global_step999")  # the mount serves its own `latest`
    (run / "notes").mkdir()  # folders are not served
    server = mount(run)
    names = sorted(p.name for p in server.mountpoint.iterdir())
    assert names == [TAG, "latest", "trainer_state.json"], names
    assert (server.mountpoint / "trainer_state.json").read_text() == '{"global_step": 3}'
    assert (server.mountpoint / "latest").read_text() == TAG


def test_truncated_source_fails_only_the_reads_that_need_it(mount, tmp_path: Path) -> None:
    run = copy_ucp(tmp_path)
    server = mount(run, "--dp", "4")
    victim = next(run.glob("*/zero/head.weight/exp_avg.pt"))
    os.truncate(victim, 100)  # exp_avg's tensor bytes are gone
    # The model-states file reads only fp32.pt: still served in full.
    assert (server.mountpoint / TAG / "mp_rank_00_model_states.pt").read_bytes()
    failed = []
    for rank in range(4):
        path = server.mountpoint / TAG / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
        try:
            path.read_bytes()
        except OSError as error:
            assert error.errno == errno.EIO, error
            failed.append(rank)
    # Group 0 is fc1.weight, fc2.weight, head.weight (1024 + 1024 + 2048 elements): at DP 4 each rank's
    # window is 1024 elements, so head.weight's exp_avg is needed by ranks 2 and 3 only.
    assert failed == [2, 3]
    assert "exp_avg.pt" in server.stderr() and "warn" in server.stderr().lower(), server.stderr()
    assert stop_server(server) == 0  # still unmounts cleanly


def optim_file(rank: int) -> str:
    return f"{TAG}/zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def test_source_replaced_by_a_new_file_keeps_serving_what_was_planned(mount, reshardfs: Path, run_tool,
                                                                      tmp_path: Path) -> None:
    """A source file renamed over (a new inode, as an atomic re-save makes it): the mount goes on reading the file it
    opened, so every served byte is still the checkpoint it planned from."""
    run = copy_ucp(tmp_path)
    expected = tree_bytes(materialized(reshardfs, run_tool, run, tmp_path / "materialized", "--dp", "4"))
    server = mount(run, "--dp", "4")
    victim = next(run.glob("*/zero/head.weight/exp_avg.pt"))
    replacement = victim.with_name("replacement.pt")
    shutil.copyfile(victim.with_name("exp_avg_sq.pt"), replacement)  # same layout, other values
    os.replace(replacement, victim)
    for rank in range(4):
        assert (server.mountpoint / optim_file(rank)).read_bytes() == expected[optim_file(rank)]
    assert stop_server(server) == 0 and "warn" not in server.stderr().lower(), server.stderr()


def test_source_rewritten_in_place_fails_the_opens_that_need_it(mount, tmp_path: Path) -> None:
    """A source file rewritten in place (the same inode, new bytes, as torch.save over an existing path does): the
    served files that read it no longer match their plan, so opening one fails with EIO and the server logs which
    source changed; files that do not read it are still served."""
    run = copy_ucp(tmp_path)
    server = mount(run, "--dp", "4")
    victim = next(run.glob("*/zero/head.weight/exp_avg.pt"))
    data = bytearray(victim.read_bytes())
    data[-200:-100] = bytes(100)  # inside the tensor bytes, before the zip directory
    time.sleep(0.01)  # a modification time the kernel's clock can tell from the mount's
    with open(victim, "r+b") as f:
        f.write(data)
    assert (server.mountpoint / TAG / "mp_rank_00_model_states.pt").read_bytes()  # reads fp32.pt only
    failed = []
    for rank in range(4):
        try:
            (server.mountpoint / optim_file(rank)).read_bytes()
        except OSError as error:
            assert error.errno == errno.EIO, error
            failed.append(rank)
    assert failed == [2, 3]  # the ranks whose partition holds head.weight (see the truncation test)
    log = server.stderr()
    assert f"{optim_file(2)}: open refused: {victim}: rewritten since it was opened" in log, log
    assert stop_server(server) == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 KiB tmpfs: room for part of a materialized checkpoint, not all of it."""
    disk = tmp_path / "small_disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", disk], check=True, capture_output=True)
    yield disk
    subprocess.run(["umount", disk], check=True, capture_output=True)


def test_materialize_into_a_full_disk_leaves_nothing_that_looks_complete(reshardfs: Path, run_tool, tmp_path: Path,
                                                                         small_disk: Path) -> None:
    """materialize runs out of space: one error line (ENOSPC, naming the file), no `latest` (so DeepSpeed does not
    see a checkpoint), no partial file left, and each file that is there holds all its bytes."""
    expected = tree_bytes(materialized(reshardfs, run_tool, UCP, tmp_path / "reference", "--dp", "4"))
    assert sum(map(len, expected.values())) > 96 * 1024
    out = small_disk / "out"
    result = run_tool(reshardfs, "materialize", UCP, out, "--dp", "4")
    assert result.returncode == 1, result
    assert result.stderr.count("\n") == 1 and "No space left on device" in result.stderr, result
    written = tree_bytes(out)
    assert "latest" not in written and written, written.keys()
    assert not [name for name in written if name.endswith(".partial")], written.keys()
    for name, data in written.items():
        assert data == expected[name], f"{name}: {len(data)} of {len(expected[name])} bytes"


def test_refusal_mounts_nothing(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_tool(reshardfs, "mount", UCP, mnt, "--zero-stage", "3", "--tp", "2", "-f")
    assert result.returncode == 1, result
    assert result.stderr.strip().splitlines() == [
        "reshardfs: error: parameter 'fc1.weight': a ZeRO-3 target with TP 2 splits only parameters with an AutoTP "
        "layout, and this one has none"], result
    assert not os.path.ismount(mnt)
