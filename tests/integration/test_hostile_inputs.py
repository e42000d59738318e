"""Bounded resources on hostile input (issue 17): every run here peaks at 256 MiB RSS or less and ends within 10 s.

Each input is crafted here from raw bytes (pickle opcodes, zip records packed with `struct`): deep nesting, huge
memo indices, tensors and storages claiming 2**40 elements, storages past their records, zip records that overlap
or lie about their sizes, a deflate bomb, lying entry counts, graphs that expand exponentially when walked, and
thousands of tiny records and files. `reshardfs inspect` (text and --json) reads the single files; `reshardfs plan`
reads universal checkpoints derived from examples/tiny/universal.

Each case says what it provokes and what the user sees: a refusal (exit 1, stdout empty, exactly one stderr line
"reshardfs: error: ..." that names the file and the problem), a success with the right answer, or either of the two
where the code's documented contract leaves both open. The bound on RSS and time holds whatever the outcome.

How RSS is measured: Linux folds the peak RSS of the image a process replaces at exec into the new program's
ru_maxrss, so a tool forked straight from this pytest process (hundreds of MiB once torch is imported) would
report at least that much. A small reaper (`python -I -S`, a few MiB) therefore forks and execs the tool and
reaps it with os.wait4, which gives the tool's own peak. The reaper kills the tool after 10 s, or as soon as its
RSS passes twice the bound, so that a runaway fails its test quickly instead of exhausting the machine.
"""

from __future__ import annotations

import collections
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
TINY_UCP = REPO / "examples" / "tiny" / "universal"
UCP_TAG = "global_step3_universal"
MODEL_STATES = "mp_rank_00_model_states.pt"

MAX_RSS_KIB = 256 * 1024
TIME_LIMIT_S = 10.0
RUNAWAY_RSS_KIB = 2 * MAX_RSS_KIB

REAPER = r"""
import json, os, signal, sys, time
out, err, limit_s, runaway_kib, *argv = sys.argv[1:]
pid = os.fork()
if pid == 0:
    try:
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
        os.execv(argv[0], argv)
    finally:
        os._exit(127)


def rss_kib():
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


start = time.monotonic()
killed = ""
while True:
    done, status, usage = os.wait4(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() - start > float(limit_s):
        killed = f"still running after {limit_s} s"
    elif rss_kib() > int(runaway_kib):
        killed = f"RSS passed {int(runaway_kib) // 1024} MiB"
    if killed:
        os.kill(pid, signal.SIGKILL)
        _, status, usage = os.wait4(pid, 0)
        break
    time.sleep(0.005)
print(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "peak_rss_kib": usage.ru_maxrss,
                  "seconds": time.monotonic() - start, "killed": killed}))
"""


@dataclass(frozen=True)
class Run:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    peak_rss_kib: int
    seconds: float
    killed: str  # why the reaper killed the tool; empty when it exited by itself

    @property
    def report(self) -> str:  # the assertion message when a check on a run fails
        return (f"$ {' '.join(self.args)}\nrc={self.returncode}, peak RSS {self.peak_rss_kib / 1024:.1f} MiB, "
                f"{self.seconds:.2f} s{', KILLED: ' + self.killed if self.killed else ''}\n"
                f"--- stdout\n{self.stdout[:2000]}\n--- stderr\n{self.stderr[-2000:]}")  # fmt: skip


def measured(reshardfs: Path, work: Path, *args: Any) -> Run:
    """Runs `reshardfs *args` under the reaper (module docstring); its output goes to files in `work`."""
    argv = [str(reshardfs), *map(str, args)]
    out, err = work / "run.stdout", work / "run.stderr"
    reaper = subprocess.run([sys.executable, "-I", "-S", "-c", REAPER, out, err, str(TIME_LIMIT_S),
                             str(RUNAWAY_RSS_KIB), *argv], capture_output=True, text=True,
                            timeout=TIME_LIMIT_S + 30, check=False)  # fmt: skip
    assert reaper.returncode == 0, reaper.stderr
    report = json.loads(reaper.stdout)
    text_out, text_err = (path.read_bytes().decode("utf-8", errors="replace") for path in (out, err))
    return Run(argv, report["returncode"], text_out, text_err, report["peak_rss_kib"], report["seconds"],
               report["killed"])  # fmt: skip


def assert_bounded(run: Run) -> None:
    assert not run.killed, run.report
    assert run.peak_rss_kib <= MAX_RSS_KIB, run.report
    assert run.seconds <= TIME_LIMIT_S, run.report


def assert_refused(run: Run, *named: str) -> None:
    """Exit 1, nothing on stdout, one stderr line "reshardfs: error: ..." holding each string of `named`."""
    assert run.returncode == 1, run.report
    assert run.stdout == "", run.report
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and run.stderr.endswith("\n") and lines[0].startswith("reshardfs: error: "), run.report
    for part in named:
        assert part in lines[0], f"{part!r} is not in the error line\n{run.report}"


# ---- pickles -----------------------------------------------------------------------------------

PROTO2 = b"\x80\x02"
PROTO4 = b"\x80\x04"
HIGH_MEMO = 0x40000000  # memo ids of injected fragments, far above the ones torch.save uses


def text(value: str) -> bytes:
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def integer(value: int) -> bytes:
    if 0 <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def global_(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tuple_(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def put(memo_id: int) -> bytes:
    return b"r" + struct.pack("<I", memo_id)


def get(memo_id: int) -> bytes:
    return b"j" + struct.pack("<I", memo_id)


def tensor(key: str, storage_numel: int, shape: list[int], stride: list[int], storage: str = "FloatStorage") -> bytes:
    """torch._utils._rebuild_tensor_v2 over storage `key`, a torch.<storage> of `storage_numel` elements."""
    pid = tuple_(text("storage"), global_("torch", storage), text(key), text("cpu"), integer(storage_numel)) + b"Q"
    args = tuple_(pid, integer(0), tuple_(*map(integer, shape)), tuple_(*map(integer, stride)), b"\x89",
                  global_("collections", "OrderedDict") + b")R")  # fmt: skip
    return global_("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def dict_of(**values: bytes) -> bytes:
    """A whole protocol-2 pickle of {key: value}, each value a pickle fragment."""
    return PROTO2 + b"}(" + b"".join(text(k) + v for k, v in values.items()) + b"u."


def doubling_dag(levels: int) -> bytes:
    """A fragment that leaves one list: `levels` lists, each holding the next one twice (2**levels paths)."""
    return b"N" + (put(HIGH_MEMO) + b"0]" + get(HIGH_MEMO) + b"a" + get(HIGH_MEMO) + b"a") * levels


def hidden_depth_chain(length: int) -> bytes:
    """A fragment that leaves one list: list k holds list k+1, `length` deep. Each list is appended to its parent
    while still empty, so the reader's depth count (raised on APPEND) never goes past 2."""
    made = b"".join(b"]" + put(HIGH_MEMO + k) + b"0" for k in range(length))
    linked = b"".join(get(HIGH_MEMO + k) + get(HIGH_MEMO + k + 1) + b"a0" for k in range(length - 1))
    return made + linked + get(HIGH_MEMO)


def many_tensors_pickle(count: int) -> bytes:
    """A list of `count` one-element float32 tensors over storages "0" .. "<count - 1>" (globals memo-shared)."""
    one_tensor = [b"h\x00((" + text("storage") + b"h\x01" + text(str(k)) + text("cpu") +
                  b"K\x01tQK\x00K\x01\x85K\x01\x85\x89h\x02)RtR" for k in range(count)]  # fmt: skip
    return (PROTO2 + global_("torch._utils", "_rebuild_tensor_v2") + b"q\x000" + global_("torch", "FloatStorage") +
            b"q\x010" + global_("collections", "OrderedDict") + b"q\x020](" + b"".join(one_tensor) + b"e.")  # fmt: skip


# ---- zip archives ------------------------------------------------------------------------------

LOCAL = struct.Struct("<IHHHHHIIIHH")
CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")


def local_header(name: bytes, size: int, *, compressed: int | None = None, method: int = 0) -> bytes:
    compressed = size if compressed is None else compressed
    return LOCAL.pack(0x04034B50, 45, 0, method, 0, 0, 0, compressed, size, len(name), 0) + name


def central_entry(name: bytes, offset: int, size: int, *, compressed: int | None = None, method: int = 0,
                  extra: bytes = b"") -> bytes:  # fmt: skip
    compressed = size if compressed is None else compressed
    return CENTRAL.pack(0x02014B50, 45, 45, 0, method, 0, 0, 0, compressed, size, len(name), len(extra), 0, 0, 0, 0,
                        offset) + name + extra  # fmt: skip


def end_records(entries: int, cd_size: int, cd_offset: int) -> bytes:
    """The EOCD, after zip64 end records when the count needs them (as torch writes large archives)."""
    if entries < 0xFFFF:
        return struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, entries, entries, cd_size, cd_offset, 0)
    zip64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, entries, entries, cd_size, cd_offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, cd_offset + cd_size, 1)
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return zip64 + locator + eocd


def laid_out(records: list[tuple[str, bytes]]) -> tuple[bytearray, bytearray]:
    """(local headers with data, central directory) of stored records, back to back from offset 0."""
    body, directory = bytearray(), bytearray()
    for name, data in records:
        directory += central_entry(name.encode(), len(body), len(data))
        body += local_header(name.encode(), len(data)) + data
    return body, directory


def stored_zip(records: list[tuple[str, bytes]]) -> bytes:
    body, directory = laid_out(records)
    return bytes(body + directory + end_records(len(records), len(directory), len(body)))


def archive(data_pkl: bytes, storages: dict[str, bytes] | None = None) -> bytes:
    """A torch.save-layout zip: archive/data.pkl, archive/byteorder, archive/data/<key> per storage, archive/version."""
    records = [("archive/data.pkl", data_pkl), ("archive/byteorder", b"little")]
    records += [(f"archive/data/{key}", data) for key, data in (storages or {}).items()]
    return stored_zip(records + [("archive/version", b"3\n")])


def one_tensor_archive() -> bytearray:
    """{'w': 4 float32 elements}: records archive/data.pkl, archive/byteorder, archive/data/0, archive/version."""
    return bytearray(archive(dict_of(w=tensor("0", 4, [4], [1])), {"0": bytes(16)}))


def patched_central(fmt: str, field: int, *values: int) -> bytes:
    """one_tensor_archive() with `values` at byte `field` of archive/data/0's central entry."""
    data = one_tensor_archive()
    position = struct.unpack_from("<I", data, len(data) - 6)[0]
    while data[position:position + 4] == b"PK\x01\x02":
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", data, position + 28)
        if data[position + CENTRAL.size:position + CENTRAL.size + name_length] == b"archive/data/0":
            struct.pack_into(fmt, data, position + field, *values)
            return bytes(data)
        position += CENTRAL.size + name_length + extra_length + comment_length
    raise AssertionError("no central entry for archive/data/0")


def local_header_sizes_lie() -> bytes:
    """one_tensor_archive() whose local header of archive/data/0 claims 4 GiB - 2 bytes (its central entry: 16)."""
    data = one_tensor_archive()
    header = data.rindex(b"PK\x03\x04", 0, data.index(b"archive/data/0"))
    struct.pack_into("<II", data, header + 18, 0xFFFFFFFE, 0xFFFFFFFE)
    return bytes(data)


def local_header_names_another() -> bytes:
    """one_tensor_archive() whose local header of archive/data/0 names archive/data/9."""
    data = one_tensor_archive()
    name = data.index(b"archive/data/0")
    data[name:name + 14] = b"archive/data/9"
    return bytes(data)


OVERLAP_BOMB_RECORDS = 2000
SHARED_BYTES_REFERENCES = 4000
MANY_RECORDS = 66_000
MANY_TENSORS = 10_000


def overlapping_records() -> bytes:
    """{'outer': uint8 x 108, 'inner': uint8 x 64} where the 108 bytes of archive/data/0 are the local header of
    archive/data/1 and its 64 bytes."""
    inner_data = b"\x07" * 64
    inner = local_header(b"archive/data/1", len(inner_data)) + inner_data
    data_pkl = dict_of(outer=tensor("0", len(inner), [len(inner)], [1], "ByteStorage"),
                       inner=tensor("1", len(inner_data), [len(inner_data)], [1], "ByteStorage"))  # fmt: skip
    body, directory = laid_out([("archive/data.pkl", data_pkl), ("archive/version", b"3\n")])
    directory += central_entry(b"archive/data/0", len(body), len(inner))
    directory += central_entry(b"archive/data/1", len(body) + LOCAL.size + len(b"archive/data/0"), len(inner_data))
    body += local_header(b"archive/data/0", len(inner)) + inner
    return bytes(body + directory + end_records(4, len(directory), len(body)))


def overlap_bomb() -> bytes:
    """OVERLAP_BOMB_RECORDS local headers back to back, then one 1 MiB kernel: the data of record k is every later
    header plus the kernel, so 1.5 MB of file holds 2 GiB of uint8 storages."""
    kernel = 1 << 20
    names = [f"archive/data/{k}".encode() for k in range(OVERLAP_BOMB_RECORDS)]
    sizes = [kernel + sum(LOCAL.size + len(n) for n in names[k + 1:]) for k in range(len(names))]
    data_pkl = dict_of(**{f"t{k}": tensor(str(k), size, [size], [1], "ByteStorage") for k, size in enumerate(sizes)})
    body, directory = laid_out([("archive/data.pkl", data_pkl), ("archive/version", b"3\n")])
    for name, size in zip(names, sizes):
        directory += central_entry(name, len(body), size)
        body += local_header(name, size)
    body += bytes(kernel)
    return bytes(body + directory + end_records(len(names) + 2, len(directory), len(body)))


def zip64_size_beyond_file() -> bytes:
    """archive/data/0's central entry holds the 0xFFFFFFFF size markers and a zip64 extra of 2**63 bytes."""
    data_pkl = dict_of(w=tensor("0", 4, [4], [1]))
    body, directory = laid_out([("archive/data.pkl", data_pkl), ("archive/version", b"3\n")])
    extra = struct.pack("<HHQQ", 1, 16, 2**63, 2**63)
    directory += central_entry(b"archive/data/0", len(body), 0xFFFFFFFF, compressed=0xFFFFFFFF, extra=extra)
    body += local_header(b"archive/data/0", 16) + bytes(16)
    return bytes(body + directory + end_records(3, len(directory), len(body)))


def deflate_bomb() -> bytes:
    """archive/data.pkl deflated (method 8): 16 KB of deflate stream (16 MiB of zeros) whose zip64 extra claims
    4 GiB uncompressed."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    stream = b"".join(compressor.compress(bytes(1 << 20)) for _ in range(16)) + compressor.flush()
    name = b"archive/data.pkl"
    body = bytearray(local_header(name, 0xFFFFFFFF, compressed=len(stream), method=8) + stream)
    directory = central_entry(name, 0, 0xFFFFFFFF, compressed=len(stream), method=8,
                              extra=struct.pack("<HHQ", 1, 8, 4 << 30))  # fmt: skip
    directory += central_entry(b"archive/version", len(body), 2)
    body += local_header(b"archive/version", 2) + b"3\n"
    return bytes(body + directory + end_records(2, len(directory), len(body)))


def eocd_count_lies() -> bytes:
    """A 2-record archive whose EOCD declares 65535 entries."""
    data = bytearray(archive(PROTO2 + b"N."))
    struct.pack_into("<HH", data, len(data) - 22 + 8, 0xFFFF, 0xFFFF)
    return bytes(data)


def zip64_count_lies() -> bytes:
    """A 2-record archive whose zip64 end record declares 2**64 - 1 entries."""
    body, directory = laid_out([("archive/data.pkl", PROTO2 + b"N."), ("archive/version", b"3\n")])
    tail = bytearray(end_records(0xFFFF, len(directory), len(body)))
    struct.pack_into("<QQ", tail, 24, 2**64 - 1, 2**64 - 1)
    return bytes(body + directory + tail)


# ---- inspect -----------------------------------------------------------------------------------


def archive_summary(run: Run, json_mode: bool) -> tuple[int, int, int]:
    """(records, storages, tensors) as a successful `inspect` reports them."""
    if json_mode:
        listing = json.loads(run.stdout)
        tensors, pending = 0, [listing["tree"]]
        while pending:
            value = pending.pop()
            if isinstance(value, dict):
                tensors += "tensor" in value
                pending.extend(v for k, v in value.items() if k != "tensor")
            elif isinstance(value, list):
                pending.extend(value)
        return len(listing["records"]), len(listing["storages"]), tensors
    match = re.search(r"torch\.save archive '[^']*/', (\d+) records, (\d+) storages \([^)]*\), (\d+) tensors\n",
                      run.stdout)  # fmt: skip
    assert match, run.report
    return int(match[1]), int(match[2]), int(match[3])


Check = Callable[[Run, bool], None]  # checks a successful run (json mode or not)


def summary_is(records: int, storages: int, tensors: int, *, then: Check | None = None) -> Check:
    def check(run: Run, json_mode: bool) -> None:
        assert archive_summary(run, json_mode) == (records, storages, tensors), run.report
        if then is not None:
            then(run, json_mode)

    return check


def sparse_memo_tree(run: Run, json_mode: bool) -> None:
    if json_mode:
        assert json.loads(run.stdout)["tree"] == {"tuple": [None, None]}, run.report


def overlap_visible(run: Run, json_mode: bool) -> None:
    if json_mode:
        records = {r["name"]: r for r in json.loads(run.stdout)["records"]}
        outer, inner = records["archive/data/0"], records["archive/data/1"]
        assert outer["offset"] < inner["offset"], run.report
        assert inner["offset"] + inner["size"] == outer["offset"] + outer["size"], run.report


def two_gib_of_storages(run: Run, json_mode: bool) -> None:
    if not json_mode:
        assert f"{OVERLAP_BOMB_RECORDS} storages (2.0 GiB)" in run.stdout, run.report


def every_reference_shown(run: Run, json_mode: bool) -> None:
    assert run.stdout.count("bytes(1048576 bytes)") == SHARED_BYTES_REFERENCES, run.report


@dataclass(frozen=True)
class Hostile:
    provokes: str  # the failure it provokes, and what the user sees
    make: Callable[[Path], None]  # writes the input at the path it is given (a file, or a checkpoint folder)
    refusal: str | None = None  # refused: the one error line holds this
    accepted: Check | None = None  # accepted: checks the output (both set: either outcome is right)
    json_refusal: str | None = None  # --json is refused with this whatever `accepted` allows without it
    flags: tuple[str, ...] = ()


def written(content: Callable[[], bytes]) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(content())


NESTING = 1_000_000

INSPECT_CASES: dict[str, Hostile] = {
    "nested_lists": Hostile(
        "1,000,000 nested EMPTY_LIST + APPEND: the lists fit the node arena's 128 MiB budget (84 MB), and the "
        "512th APPEND nests past the depth limit",
        written(lambda: archive(PROTO2 + b"]" * NESTING + b"a" * (NESTING - 1) + b".")),
        refusal="APPEND: nesting depth 513 exceeds limit 512"),
    "nested_tuple1": Hostile(
        "EMPTY_TUPLE wrapped by 1,000,000 TUPLE1: refused at depth 513 as soon as it is reached",
        written(lambda: archive(PROTO2 + b")" + b"\x85" * NESTING + b".")),
        refusal="TUPLE1: nesting depth 513 exceeds limit 512"),
    "open_marks": Hostile(
        "1,100,000 MARKs never closed: the open-MARK limit refuses the 2**20 + 1st",
        written(lambda: archive(PROTO2 + b"(" * (NESTING + 100_000) + b"N.")),
        refusal="open MARK limit 1048576 exceeded"),
    "hidden_depth_chain": Hostile(
        "10,000 lists nested through the memo after placement (the reader sees depth 2): the tree printer, which "
        "recurses, stops at depth 512",
        written(lambda: archive(PROTO2 + hidden_depth_chain(10_000) + b".")),
        refusal="nesting deeper than 512"),
    "memo_get_never_stored": Hostile(
        "LONG_BINGET 0xFFFFFFFF with nothing stored: refused, no 2**32-entry table",
        written(lambda: archive(PROTO2 + get(0xFFFFFFFF) + b".")),
        refusal="LONG_BINGET: id 4294967295 was never stored"),
    "memo_put_get_max_id": Hostile(
        "LONG_BINPUT then LONG_BINGET 0xFFFFFFFF: legal, and the sparse memo reads it for one entry",
        written(lambda: archive(PROTO2 + b"N" + put(0xFFFFFFFF) + get(0xFFFFFFFF) + b"\x86.")),
        accepted=summary_is(3, 0, 0, then=sparse_memo_tree)),
    "memo_flood": Hostile(
        "2**20 + 1 MEMOIZE (1 byte each): the memo entry limit refuses the last",
        written(lambda: archive(PROTO4 + b"N" + b"\x94" * ((1 << 20) + 1) + b".")),
        refusal="MEMOIZE: id 1048576: memo limit 1048576 exceeded"),
    "stack_flood": Hostile(
        "2**20 + 1 NONE (a 1 MiB pickle): the stack limit refuses the last one (the node arena's 128 MiB budget "
        "holds some 1,600,000 nodes)",
        written(lambda: archive(PROTO2 + b"N" * ((1 << 20) + 1) + b".")),
        refusal="NONE: stack limit 1048576 exceeded"),
    "node_flood": Hostile(
        "2,000 tuples of 1,000 NONE, each popped (a 2 MB pickle, about one node per byte, so 84 tree bytes per "
        "pickle byte): the node arena's budget, 128 MiB or 64 bytes per pickle byte, refuses it",
        written(lambda: archive(PROTO2 + (b"(" + b"N" * 1000 + b"t0") * 2000 + b"N.")),
        refusal="NONE: node limit"),
    "doubling_dag": Hostile(
        "40 lists each holding the next twice (a 764-byte pickle, 2**40 paths): the tree printer's 96 MiB budget "
        "refuses it before it builds hundreds of MiB",
        written(lambda: archive(PROTO2 + doubling_dag(40) + b".")),
        refusal="bytes to print (shared values are printed at each reference)"),
    "shared_bytes": Hostile(
        "one 1 MiB bytes object referenced 4000 times (a 1 MiB pickle): --json would print 8 GB of hex and is "
        "refused; the text form shows each as 'bytes(1048576 bytes)' or is refused",
        written(lambda: archive(PROTO2 + b"B" + struct.pack("<I", 1 << 20) + bytes(1 << 20) + put(0) + b"0](" +
                                get(0) * SHARED_BYTES_REFERENCES + b"e.")),  # fmt: skip
        refusal="data.pkl", accepted=summary_is(3, 0, 0, then=every_reference_shown), json_refusal="data.pkl"),
    "tensor_2_40_elements": Hostile(
        "a [2**20, 2**20] float32 view of a 16-byte storage: refused, nothing allocated for it",
        written(lambda: archive(dict_of(w=tensor("0", 4, [2**20, 2**20], [2**20, 1])), {"0": bytes(16)})),
        refusal="view of storage '0' ends past its 16 bytes"),
    "storage_claims_2_40_elements": Hostile(
        "a storage whose persistent id claims 2**40 float32 elements over a 16-byte record",
        written(lambda: archive(dict_of(w=tensor("0", 2**40, [2**20, 2**20], [2**20, 1])), {"0": bytes(16)})),
        refusal="record 'archive/data/0' holds 16 bytes but its storage needs 4398046511104"),
    "storage_shorter_than_view": Hostile(
        "a [3, 2] float32 tensor over a 16-byte storage record (24 bytes needed)",
        written(lambda: archive(dict_of(w=tensor("0", 4, [3, 2], [2, 1])), {"0": bytes(16)})),
        refusal="view of storage '0' ends past its 16 bytes"),
    "overlapping_records": Hostile(
        "a record whose data holds another record (header and data): overlaps are not checked (zip_reader.h, as "
        "torch.load), both tensors are read where the directory says",
        written(overlapping_records), accepted=summary_is(4, 2, 2, then=overlap_visible)),
    "overlap_bomb": Hostile(
        "2000 nested records over one 1 MiB kernel (1.5 MB of file, 2 GiB of storages): accepted for free, since "
        "inspect touches no tensor byte",
        written(overlap_bomb),
        accepted=summary_is(OVERLAP_BOMB_RECORDS + 2, OVERLAP_BOMB_RECORDS, OVERLAP_BOMB_RECORDS,
                            then=two_gib_of_storages)),  # fmt: skip
    "central_size_beyond_file": Hostile(
        "a central entry claiming 4 GiB - 2 bytes (compressed and uncompressed) in a 600-byte file",
        written(lambda: patched_central("<II", 20, 0xFFFFFFFE, 0xFFFFFFFE)),
        refusal="record 'archive/data/0': data of 4294967294 bytes at offset"),
    "zip64_size_beyond_file": Hostile(
        "a central entry whose zip64 extra claims 2**63 bytes",
        written(zip64_size_beyond_file),
        refusal="record 'archive/data/0': data of 9223372036854775808 bytes"),
    "stored_sizes_disagree": Hostile(
        "a stored central entry with compressed size 16 and size 4 GiB - 16",
        written(lambda: patched_central("<I", 24, 0xFFFFFFF0)),
        refusal="compressed size 16 differs from its size 4294967280"),
    "local_header_sizes_lie": Hostile(
        "a local header claiming 4 GiB - 2 bytes where its central entry says 16: the central sizes rule, as in "
        "torch.load, and the file reads normally",
        written(local_header_sizes_lie),
        accepted=summary_is(4, 1, 1)),
    "local_header_names_another": Hostile(
        "a local header naming archive/data/9 under the central entry of archive/data/0",
        written(local_header_names_another),
        refusal="names 'archive/data/9'"),
    "deflate_bomb": Hostile(
        "data.pkl deflated, 16 KB claiming 4 GiB: refused before any inflation (only stored records are read)",
        written(deflate_bomb),
        refusal="record 'archive/data.pkl' is compressed (method 8)"),
    "eocd_entry_count": Hostile(
        "an EOCD declaring 65535 entries over a 2-entry directory: refused before reserving anything",
        written(eocd_count_lies),
        refusal="cannot hold the 65535 entries declared"),
    "zip64_entry_count": Hostile(
        "a zip64 end record declaring 2**64 - 1 entries: refused before reserving anything",
        written(zip64_count_lies),
        refusal="cannot hold the 18446744073709551615 entries declared"),
    "many_empty_records": Hostile(
        "66,000 empty records (6 MB; past the 16-bit EOCD count, so zip64 end records): legal, listed in full",
        written(lambda: stored_zip([("a/data.pkl", PROTO2 + b"N."), ("a/version", b"3\n")] +
                                   [(f"a/{k:x}", b"") for k in range(MANY_RECORDS)])),  # fmt: skip
        accepted=summary_is(MANY_RECORDS + 2, 0, 0)),
    "many_tensors": Hostile(
        "10,000 one-element tensors, each with its own storage record (1.6 MB): a legal archive, listed in full",
        written(lambda: stored_zip([("a/data.pkl", many_tensors_pickle(MANY_TENSORS)), ("a/version", b"3\n")] +
                                   [(f"a/data/{k}", struct.pack("<f", k)) for k in range(MANY_TENSORS)])),  # fmt: skip
        accepted=summary_is(MANY_TENSORS + 2, MANY_TENSORS, MANY_TENSORS)),
}


def check_outcome(run: Run, case: Hostile, json_mode: bool, *named: str) -> None:
    refusal = case.json_refusal if json_mode and case.json_refusal else case.refusal
    accepted = None if json_mode and case.json_refusal else case.accepted
    if refusal is not None and (accepted is None or run.returncode != 0):
        assert_refused(run, *named, refusal)
    else:
        assert accepted is not None
        assert run.returncode == 0 and run.stderr == "", run.report
        accepted(run, json_mode)


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize("name", INSPECT_CASES)
def test_inspect_hostile(name: str, json_flag: list[str], reshardfs: Path, tmp_path: Path) -> None:
    """`reshardfs inspect [--json]` of one crafted file: the outcome INSPECT_CASES[name].provokes, the refusal naming
    the file, within 256 MiB and 10 s."""
    case = INSPECT_CASES[name]
    path = tmp_path / f"{name}.pt"
    case.make(path)
    run = measured(reshardfs, tmp_path, "inspect", path, *json_flag)
    assert_bounded(run)
    check_outcome(run, case, bool(json_flag), path.name)


# ---- plan --------------------------------------------------------------------------------------

HOSTILE_MARK = "@@hostile value@@"
MANY_PARAMS = 3000


def tiny_ucp(root: Path) -> Path:
    """A copy of examples/tiny/universal at `root`; returns its tag folder."""
    shutil.copytree(TINY_UCP, root)
    return root / UCP_TAG


def rezipped(path: Path, edit: Callable[[bytes], bytes]) -> None:
    """Rewrites the torch.save file `path` as a stored zip of its records, with data.pkl passed through `edit`."""
    with zipfile.ZipFile(path) as source:
        records = [(info.filename, source.read(info)) for info in source.infolist()]
    path.write_bytes(stored_zip([(name, edit(data) if name.endswith("/data.pkl") else data) for name, data in records]))


def lr_scheduler_is(fragment: bytes) -> Callable[[Path], None]:
    """The tiny checkpoint, with the pickle fragment (one value) as its model-states file's lr_scheduler."""

    def make(root: Path) -> None:
        path = tiny_ucp(root) / MODEL_STATES
        states = torch.load(path, weights_only=False)
        states["lr_scheduler"] = HOSTILE_MARK
        torch.save(states, path)
        rezipped(path, lambda data_pkl: data_pkl.replace(text(HOSTILE_MARK), fragment))

    return make


def fc1_bias_fp32_is(content: Callable[[], bytes]) -> Callable[[Path], None]:
    """The tiny checkpoint, with `content` as zero/fc1.bias/fp32.pt."""

    def make(root: Path) -> None:
        (tiny_ucp(root) / "zero" / "fc1.bias" / "fp32.pt").write_bytes(content())

    return make


def many_params(root: Path) -> None:
    """The tiny checkpoint's metadata with MANY_PARAMS parameters of 2 elements in its two param groups, each with
    fp32.pt, exp_avg.pt, exp_avg_sq.pt and step.pt."""
    tag = tiny_ucp(root)
    for folder in (tag / "zero").iterdir():
        if folder.is_dir():
            shutil.rmtree(folder)
    states = torch.load(tag / MODEL_STATES, weights_only=False)
    names = [f"layers.{k}.bias" for k in range(MANY_PARAMS)]
    states["module"] = collections.OrderedDict((name, torch.zeros(2)) for name in names)
    half = MANY_PARAMS // 2
    states["param_shapes"] = [collections.OrderedDict((name, torch.Size([2])) for name in group)
                              for group in (names[:half], names[half:])]  # fmt: skip
    torch.save(states, tag / MODEL_STATES)
    files = {"step.pt": (TINY_UCP / UCP_TAG / "zero" / "fc1.bias" / "step.pt").read_bytes()}
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        buffer = io.BytesIO()
        torch.save({"cat_dim": 0, "param": torch.ones(2)}, buffer)
        files[f"{state}.pt"] = buffer.getvalue()
    for name in names:
        (tag / "zero" / name).mkdir()
        for file_name, content in files.items():
            (tag / "zero" / name / file_name).write_bytes(content)


def many_params_planned(run: Run, json_mode: bool) -> None:
    """plan --dp 4 --json: the model-states file and 4 optimizer files, serving each parameter's 4 tensors of 2
    float32 elements (module weight, fp32, exp_avg, exp_avg_sq) once, plus a float32 step per param group and file."""
    listing = json.loads(run.stdout)
    assert len(listing["files"]) == 5, run.report
    assert listing["total"]["tensor_bytes"] == MANY_PARAMS * 4 * 2 * 4 + 2 * 4 * 4, run.report
    assert listing["total"]["source_bytes"] == listing["total"]["tensor_bytes"], run.report


def plans_three_files(run: Run, json_mode: bool) -> None:
    assert "total: 3 files" in run.stdout, run.report


PLAN_CASES: dict[str, Hostile] = {
    "many_params": Hostile(
        "3000 parameter folders, 12,000 tiny state files: indexed and planned in full",
        many_params, accepted=many_params_planned, flags=("--dp", "4", "--json")),
    "lr_scheduler_doubling_dag": Hostile(
        "an lr_scheduler of 40 lists each holding the next twice (761 bytes, 2**40 paths): legal (torch.load reads it, "
        "the pickle writer memo-shares it), so planned or refused, but never walked path by path",
        lr_scheduler_is(doubling_dag(40)), refusal=MODEL_STATES, accepted=plans_three_files),
    "lr_scheduler_hidden_depth_chain": Hostile(
        "an lr_scheduler of 10,000 lists nested through the memo (the reader sees depth 2): refused by the import "
        "into the served file at depth 512",
        lr_scheduler_is(hidden_depth_chain(10_000)), refusal=f"{MODEL_STATES}: value nested deeper than 512"),
    "state_file_nested_lists": Hostile(
        "fp32.pt of 100,000 nested lists: refused by the reader, naming the state file",
        fc1_bias_fp32_is(lambda: archive(PROTO2 + b"]" * 100_000 + b"a" * 99_999 + b".")),
        refusal="zero/fc1.bias/fp32.pt: data.pkl: offset 100513: APPEND: nesting depth 513 exceeds limit 512"),
    "state_file_tensor_2_40_elements": Hostile(
        "fp32.pt whose param is a [2**20, 2**20] view of a 128-byte storage",
        fc1_bias_fp32_is(lambda: archive(dict_of(cat_dim=b"K\x00", param=tensor("0", 32, [2**20, 2**20], [2**20, 1])),
                                         {"0": bytes(128)})),  # fmt: skip
        refusal="zero/fc1.bias/fp32.pt: data.pkl: tensor rebuild: view of storage '0' ends past its 128 bytes"),
    "state_file_deflate_bomb": Hostile(
        "fp32.pt with a deflated data.pkl claiming 4 GiB",
        fc1_bias_fp32_is(deflate_bomb),
        refusal="zero/fc1.bias/fp32.pt: record 'archive/data.pkl' is compressed (method 8)"),
}


@pytest.mark.parametrize("name", PLAN_CASES)
def test_plan_hostile(name: str, reshardfs: Path, tmp_path: Path) -> None:
    """`reshardfs plan` of a universal checkpoint with one crafted part: the outcome PLAN_CASES[name].provokes, the
    refusal naming the file, within 256 MiB and 10 s."""
    case = PLAN_CASES[name]
    root = tmp_path / "ucp"
    case.make(root)
    run = measured(reshardfs, tmp_path, "plan", root, *case.flags)
    assert_bounded(run)
    check_outcome(run, case, "--json" in case.flags)
