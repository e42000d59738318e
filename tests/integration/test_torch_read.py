"""`reshardfs inspect --json` on torch.save files, against Python's own readers.

  tree      == the inert unpickler's JSON of the same data.pkl (Python's C unpickler, nothing run)
  records   == zipfile's entries, data offset = header_offset + local header length
  storages  == the data/<key> records, and their bytes == what torch.load put behind each tensor
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from inert_unpickler import UNTYPED_STORAGE, json_diff, reference_tree, resolve, storage_dtype, tensor_nodes


def zip_records(path: Path) -> list[dict[str, Any]]:
    """Every entry of the archive as inspect reports it, in central-directory order."""
    records = []
    with zipfile.ZipFile(path) as archive, path.open("rb") as f:
        for info in archive.infolist():
            assert info.compress_type == zipfile.ZIP_STORED, info
            f.seek(info.header_offset)
            header = f.read(30)
            assert header[:4] == b"PK\x03\x04", info
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            offset = info.header_offset + 30 + name_len + extra_len
            records.append({"name": info.filename, "offset": offset, "size": info.file_size})
    return records


def storage_u8(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind `t` as a uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def bytes_u8(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def check_tensor(t: Any, node: dict[str, Any], where: Any) -> None:
    assert isinstance(t, torch.Tensor), f"{where}: torch.load gave {type(t).__name__}"
    got = {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "storage_offset": t.storage_offset(),
        "storage": node["storage"],
        "requires_grad": t.requires_grad,
    }
    assert got == node, f"{where}: torch.load {got} != tree {node}"


def test_reference_matches_torch_load(case: str, case_file) -> None:
    """The reference itself, no C++: each tensor node describes the tensor torch.load builds."""
    path = case_file(case)
    tree, pids = reference_tree(path)
    loaded = torch.load(path, weights_only=False)
    nodes = list(tensor_nodes(tree))
    for where, node in nodes:
        check_tensor(resolve(loaded, where), node, where)
    keys = {pid[2] for pid in pids}
    assert {node["storage"] for _, node in nodes} <= keys
    names = [r["name"].split("/", 1)[1] for r in zip_records(path)]
    assert keys == {name.removeprefix("data/") for name in names if name.startswith("data/")}


def test_inspect_tree(case: str, case_file, inspect_json) -> None:
    path = case_file(case)
    expected, _ = reference_tree(path)
    diff = json_diff(inspect_json(path)["tree"], expected)
    assert diff is None, f"C++ tree differs from the inert unpickler at {diff}"


def test_inspect_records(case: str, case_file, inspect_json) -> None:
    path = case_file(case)
    doc = inspect_json(path)
    assert doc["file"] == str(path)
    assert doc["records"] == zip_records(path)


def test_inspect_storages(case: str, case_file, inspect_json) -> None:
    path = case_file(case)
    doc = inspect_json(path)
    _, pids = reference_tree(path)
    pid_by_key = {pid[2]: pid for pid in pids}
    assert sorted(doc["storages"]) == sorted(pid_by_key), "storages must list every persistent id"

    records = {r["name"]: r for r in zip_records(path)}
    prefix = next(iter(records)).split("/", 1)[0]
    tensor_dtypes: dict[str, set[str]] = {}
    for _, node in tensor_nodes(doc["tree"]):
        tensor_dtypes.setdefault(node["storage"], set()).add(node["dtype"])

    for key, storage in doc["storages"].items():
        record = records[f"{prefix}/data/{key}"]
        assert storage["record"] == record["name"], key
        assert storage["offset"] == record["offset"], key
        assert storage["nbytes"] == record["size"], key
        pid = pid_by_key[key]
        # An UntypedStorage (_rebuild_tensor_v3) is uint8 to torch.load; its tensors' dtype also fits.
        allowed = {storage_dtype(pid)}
        if pid[1].qualname == UNTYPED_STORAGE:
            allowed |= tensor_dtypes.get(key, set())
        assert storage["dtype"] in allowed, key
        assert storage["numel"] * getattr(torch, storage["dtype"]).itemsize == storage["nbytes"], key
        if storage["dtype"] == storage_dtype(pid):
            assert storage["numel"] == pid[4], key

    data = path.read_bytes()
    loaded = torch.load(path, weights_only=False)
    for where, node in tensor_nodes(doc["tree"]):
        t = resolve(loaded, where)
        check_tensor(t, node, where)
        storage = doc["storages"][node["storage"]]
        in_file = data[storage["offset"] : storage["offset"] + storage["nbytes"]]
        assert torch.equal(storage_u8(t), bytes_u8(in_file)), f"{where}: storage {node['storage']} bytes differ"
