"""The `reshardfs` command line: --version, --help, and refusing bad input cleanly.

Bad inputs run through the ASan/UBSan build: each must exit non-zero (not by a signal), print
nothing on stdout and exactly one stderr line `reshardfs: error: ...` naming the file, and no
sanitizer report. Positive controls made the same way prove the refusals are about the defect.
"""

from __future__ import annotations

import json
import pickle
import re
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from inert_unpickler import reference_tree

REPO = Path(__file__).resolve().parents[2]
SANITIZER_MARKERS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")


def project_version() -> str:
    match = re.search(r"project\(reshardfs\s+VERSION\s+([0-9.]+)", (REPO / "CMakeLists.txt").read_text())
    assert match, "no VERSION in CMakeLists.txt project()"
    return match.group(1)


@pytest.fixture(params=["release", "asan"])
def any_reshardfs(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("reshardfs" if request.param == "release" else "asan_reshardfs")


def test_version(any_reshardfs: Path, run_tool) -> None:
    result = run_tool(any_reshardfs, "--version")
    assert result.returncode == 0, result
    assert result.stdout.strip() == f"reshardfs {project_version()}", result


def test_help(any_reshardfs: Path, run_tool) -> None:
    result = run_tool(any_reshardfs, "--help")
    assert result.returncode == 0 and "inspect" in result.stdout, result
    result = run_tool(any_reshardfs, "inspect", "--help")
    assert result.returncode == 0 and "--json" in result.stdout, result


def test_inspect_under_asan(case: str, case_file, asan_reshardfs: Path, run_tool, inspect_json) -> None:
    """Good files: the sanitized build is silent and prints what the release build prints."""
    path = case_file(case)
    result = run_tool(asan_reshardfs, "inspect", path, "--json")
    assert result.returncode == 0 and result.stderr == "", result
    assert json.loads(result.stdout) == inspect_json(path)


# ---- bad inputs -------------------------------------------------------------------------------

PROTO2 = b"\x80\x02"


def torch_archive(path: Path, data_pkl: bytes) -> Path:
    """A torch-layout archive written by torch's own writer, holding `data_pkl` as data.pkl."""
    writer = torch._C.PyTorchFileWriter(str(path))
    for name, data in (("data.pkl", data_pkl), ("byteorder", b"little")):
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    return path


def saved_file(path: Path) -> Path:
    torch.manual_seed(0)
    torch.save({"weight": torch.randn(16, 16), "step": 3}, path)
    return path


def patched(path: Path, edits: Callable[[bytearray], None]) -> Path:
    data = bytearray(saved_file(path).read_bytes())
    edits(data)
    path.write_bytes(data)
    return path


def central_directory(data: bytearray) -> int:
    """Offset of the central directory, from the end-of-central-directory record."""
    assert data[-22:-18] == b"PK\x05\x06"
    return struct.unpack_from("<I", data, len(data) - 22 + 16)[0]


def in_cd(fmt: str, field: int, value: int) -> Callable[[Path], Path]:
    """A saved file whose first central-directory entry has `value` at byte `field`."""

    def edit(data: bytearray) -> None:
        struct.pack_into(fmt, data, central_directory(data) + field, value)

    return lambda path: patched(path, edit)


def written(content: bytes) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        path.write_bytes(content)
        return path

    return make


def cd_offset_beyond_file(data: bytearray) -> None:
    struct.pack_into("<I", data, len(data) - 22 + 16, 0x7FFFFFF0)  # end of central directory
    struct.pack_into("<Q", data, len(data) - 22 - 20 - 56 + 48, 0x7FFFFFF0)  # its zip64 twin


def rezipped(path: Path, compress_data_pkl: bool) -> Path:
    """The records of a torch.save file copied by Python's zipfile, data.pkl optionally deflated."""
    source = saved_file(path.with_suffix(".orig"))
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            deflate = compress_data_pkl and info.filename.endswith("/data.pkl")
            dst.writestr(info.filename, src.read(info), zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED)
    return path


def truncated(keep: Callable[[int], int]) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        data = saved_file(path).read_bytes()
        path.write_bytes(data[: keep(len(data))])
        return path

    return make


def bad_pickle(body: bytes) -> Callable[[Path], Path]:
    return lambda path: torch_archive(path, PROTO2 + body)


NESTING = 100_000

BAD_INPUTS: dict[str, Callable[[Path], Path]] = {
    "missing_file": lambda path: path,
    "empty_file": written(b""),
    "text_file": written(b"not a checkpoint\n" * 10),
    "truncated_half": truncated(lambda n: n // 2),
    "truncated_last_byte": truncated(lambda n: n - 1),
    "truncated_to_64_bytes": truncated(lambda n: 64),
    "cd_bad_signature": in_cd("<I", 0, 0x58585858),
    "cd_sizes_beyond_file": in_cd("<Q", 20, 0x7FFFFFF0_7FFFFFF0),  # compressed and uncompressed
    "cd_name_length_beyond_file": in_cd("<H", 28, 0xFFFF),
    "cd_local_header_beyond_file": in_cd("<I", 42, 0x7FFFFFF0),
    "eocd_cd_offset_beyond_file": lambda path: patched(path, cd_offset_beyond_file),
    "deflated_data_pkl": lambda path: rezipped(path, compress_data_pkl=True),
    "pickle_unknown_opcode": bad_pickle(b"\xff."),
    "pickle_deep_nesting": bad_pickle(b"]" * NESTING + b"a" * (NESTING - 1) + b"."),
    "pickle_memo_get_huge_index": bad_pickle(b"j\xff\xff\xff\xff."),
    "pickle_binunicode_beyond_file": bad_pickle(b"X\xf0\xff\xff\xffabc."),
    "pickle_short_binstring_beyond_file": bad_pickle(b"U\xffabc."),
    "pickle_long4_beyond_file": bad_pickle(b"\x8b\xff\xff\xff\x7f\x01."),
    "pickle_no_stop": bad_pickle(b"]q\x00(K\x01K\x02e"),
}

GOOD_CONTROLS: dict[str, Callable[[Path], Path]] = {
    "torch_writer_archive": lambda path: torch_archive(path, pickle.dumps({"a": [1, 2.5, None]}, protocol=2)),
    "zipfile_stored_archive": lambda path: rezipped(path, compress_data_pkl=False),
}


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input_refused(name: str, json_flag: list[str], asan_reshardfs: Path, run_tool, tmp_path: Path) -> None:
    path = BAD_INPUTS[name](tmp_path / f"{name}.pt")
    result = run_tool(asan_reshardfs, "inspect", path, *json_flag)
    assert not any(marker in result.stderr for marker in SANITIZER_MARKERS), result
    assert result.returncode > 0, result  # refused, and not killed by a signal
    assert result.stdout == "", result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("reshardfs: error: "), result
    assert path.name in lines[0], result


@pytest.mark.parametrize("name", GOOD_CONTROLS)
def test_good_control_accepted(name: str, asan_reshardfs: Path, run_tool, tmp_path: Path) -> None:
    path = GOOD_CONTROLS[name](tmp_path / f"{name}.pt")
    result = run_tool(asan_reshardfs, "inspect", path, "--json")
    assert result.returncode == 0 and result.stderr == "", result
    assert json.loads(result.stdout)["tree"] == reference_tree(path)[0]


def test_sparse_huge_memo_id_accepted(asan_reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """LONG_BINPUT/LONG_BINGET 2**32-1 is legal; a sparse memo reads it without a 32 GiB table.
    (Python's C unpickler itself fails here with MemoryError, hence the literal tree.)"""
    path = torch_archive(tmp_path / "memo.pt", PROTO2 + b"(Nr\xff\xff\xff\xffj\xff\xff\xff\xfft.")
    result = run_tool(asan_reshardfs, "inspect", path, "--json")
    assert result.returncode == 0 and result.stderr == "", result
    assert json.loads(result.stdout)["tree"] == {"tuple": [None, None]}
