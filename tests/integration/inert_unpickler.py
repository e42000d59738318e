"""An independent reference for the "tree" of `reshardfs inspect --json`.

Python's own C unpickler parses data.pkl, but nothing in the pickle runs: `find_class` returns a
stub class instead of importing anything, and `persistent_load` returns a marker. The stubs turn
what the pickle asks for into inert, mutable records:

  REDUCE     callable(*args)           -> a stub class (or record) is called: Record("reduce")
  NEWOBJ     cls.__new__(cls, *args)   -> the stub's __new__ returns Record("newobj")
  BUILD      obj.__setstate__(state)   -> sets Record.state (on the shared, memoized record)
  SETITEMS   obj[key] = value          -> appends to Record.dictitems
  APPENDS    obj.extend(items)         -> extends Record.listitems

`to_json` then encodes the result exactly as the C++ tool does, including its tensor rule, and
`json_diff` compares two encodings strictly (bool is not int, floats bit for bit).
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# torch/storage.py _dtype_to_storage_type_map: the storage class a _rebuild_tensor_v2 pickle names.
STORAGE_CLASS_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
}
UNTYPED_STORAGE = "UntypedStorage"  # _rebuild_tensor_v3: numel counts bytes, dtype is an argument

# Exact argument counts of the calls shown as {"tensor": ...}; anything else stays a "reduce".
TENSOR_REBUILDERS = {"_rebuild_tensor_v2": 6, "_rebuild_tensor_v3": 7}

_ABSENT = object()


class Record:
    """What REDUCE or NEWOBJ produced. BUILD, SETITEMS and APPENDS mutate it in place."""

    def __init__(self, kind: str, items: list[Any]) -> None:
        self.kind = kind  # "reduce" or "newobj"
        self.items = items  # [callable, args] or [cls, args] or [cls, args, kwargs]
        self.state: Any = _ABSENT
        self.dictitems: list[tuple[Any, Any]] = []
        self.listitems: list[Any] = []

    def __call__(self, *args: Any) -> Record:
        return Record("reduce", [self, args])

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.dictitems.append((key, value))

    def append(self, item: Any) -> None:
        self.listitems.append(item)

    def extend(self, items: list[Any]) -> None:
        self.listitems.extend(items)


class PersId:
    """A BINPERSID marker. No __dict__, so a BUILD on it fails instead of being absorbed."""

    __slots__ = ("pid",)

    def __init__(self, pid: Any) -> None:
        self.pid = pid


class GlobalStub(type):
    """The metaclass of the stub classes find_class returns: calling one is a REDUCE."""

    module: str
    qualname: str

    def __call__(cls, *args: Any) -> Record:
        return Record("reduce", [cls, args])


def _stub_new(cls: GlobalStub, *args: Any, **kwargs: Any) -> Record:
    return Record("newobj", [cls, args, kwargs] if kwargs else [cls, args])


class InertUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        # fix_imports=False keeps protocol-2 names as written (__builtin__, not builtins);
        # utf-8 is what torch.load uses for Python 2 strings.
        super().__init__(io.BytesIO(data), fix_imports=False, encoding="utf-8")
        self.persistent_ids: list[Any] = []

    def find_class(self, module: str, name: str) -> GlobalStub:
        return GlobalStub(name, (), {"__new__": _stub_new, "module": module, "qualname": name})

    def persistent_load(self, pid: Any) -> PersId:
        self.persistent_ids.append(pid)
        return PersId(pid)


def load_inert(data: bytes) -> tuple[Any, list[Any]]:
    """Unpickles `data` inertly; returns the root and every persistent id in load order."""
    unpickler = InertUnpickler(data)
    root = unpickler.load()
    return root, unpickler.persistent_ids


def data_pkl(path: Path) -> bytes:
    """The data.pkl record of a torch.save archive (zipfile checks its CRC)."""
    with zipfile.ZipFile(path) as archive:
        prefix = archive.infolist()[0].filename.split("/", 1)[0]
        return archive.read(f"{prefix}/data.pkl")


def reference_tree(path: Path) -> tuple[Any, list[Any]]:
    """The JSON tree of a torch.save file, and its persistent ids."""
    root, pids = load_inert(data_pkl(path))
    return to_json(root), pids


# ---- encoding ---------------------------------------------------------------------------------


def to_json(obj: Any) -> Any:
    return _Encoder().encode(obj)


class _Encoder:
    def __init__(self) -> None:
        self.active: set[int] = set()  # containers being encoded, to refuse cycles

    def encode(self, obj: Any) -> Any:
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int):
            return obj if INT64_MIN <= obj <= INT64_MAX else {"int": str(obj)}
        if isinstance(obj, float):
            return {"float": _float(obj)}
        if isinstance(obj, bytes):
            return {"bytes": obj.hex()}
        if isinstance(obj, bytearray):
            return {"bytearray": obj.hex()}
        if isinstance(obj, GlobalStub):
            return {"global": [obj.module, obj.qualname]}
        if id(obj) in self.active:
            raise ValueError("cyclic pickle graph")
        self.active.add(id(obj))
        try:
            return self._encode_container(obj)
        finally:
            self.active.discard(id(obj))

    def _encode_container(self, obj: Any) -> Any:
        if isinstance(obj, list):
            return [self.encode(v) for v in obj]
        if isinstance(obj, tuple):
            return {"tuple": [self.encode(v) for v in obj]}
        if isinstance(obj, dict):
            return {"dict": [[self.encode(k), self.encode(v)] for k, v in obj.items()]}
        if isinstance(obj, frozenset):
            return {"frozenset": [self.encode(v) for v in obj]}
        if isinstance(obj, set):
            return {"set": [self.encode(v) for v in obj]}
        if isinstance(obj, PersId):
            return {"persid": self.encode(obj.pid)}
        if isinstance(obj, Record):
            return _tensor(obj) or self._record(obj)
        raise TypeError(f"unexpected {type(obj).__name__} in an inert pickle")

    def _record(self, rec: Record) -> dict[str, Any]:
        node: dict[str, Any] = {rec.kind: [self.encode(v) for v in rec.items]}
        if rec.state is not _ABSENT:
            node["state"] = self.encode(rec.state)
        if rec.dictitems:
            node["dictitems"] = [[self.encode(k), self.encode(v)] for k, v in rec.dictitems]
        if rec.listitems:
            node["listitems"] = [self.encode(v) for v in rec.listitems]
        return node


def _float(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _is_global(obj: Any, module: str, names: Any) -> bool:
    return isinstance(obj, GlobalStub) and obj.module == module and obj.qualname in names


def _is_int_tuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and all(type(v) is int for v in obj)


def _tensor(rec: Record) -> dict[str, Any] | None:
    """{"tensor": ...} for a plain _rebuild_tensor_v2/_v3 call on a ('storage', ...) persid."""
    if rec.kind != "reduce" or rec.state is not _ABSENT or rec.dictitems or rec.listitems:
        return None
    func, args = rec.items
    if not _is_global(func, "torch._utils", TENSOR_REBUILDERS):
        return None
    if not isinstance(args, tuple) or len(args) != TENSOR_REBUILDERS[func.qualname]:
        return None
    storage, storage_offset, size, stride, requires_grad = args[:5]
    if not (isinstance(storage, PersId) and isinstance(storage.pid, tuple)):
        return None
    pid = storage.pid
    if len(pid) != 5 or pid[0] != "storage" or not isinstance(pid[1], GlobalStub):
        return None
    if len(args) == 7:
        if not (isinstance(args[6], GlobalStub) and args[6].module == "torch"):
            return None
        dtype = args[6].qualname
    else:
        dtype = STORAGE_CLASS_DTYPES.get(pid[1].qualname)
    valid = (
        dtype is not None
        and isinstance(pid[2], str)
        and type(storage_offset) is int
        and _is_int_tuple(size)
        and _is_int_tuple(stride)
        and isinstance(requires_grad, bool)
    )
    if not valid:
        return None
    return {
        "tensor": {
            "dtype": dtype,
            "shape": list(size),
            "stride": list(stride),
            "storage_offset": storage_offset,
            "storage": pid[2],
            "requires_grad": requires_grad,
        }
    }


def storage_dtype(pid: tuple[Any, ...]) -> str:
    """The dtype torch.load gives a storage from its persistent id alone (UntypedStorage: uint8)."""
    name = pid[1].qualname
    return "uint8" if name == UNTYPED_STORAGE else STORAGE_CLASS_DTYPES[name]


# ---- comparing encodings ----------------------------------------------------------------------


def json_diff(a: Any, b: Any, path: str = "$") -> str | None:
    """The first difference between two JSON values, or None. Types must match exactly."""
    if type(a) is not type(b):
        return f"{path}: {a!r} ({type(a).__name__}) != {b!r} ({type(b).__name__})"
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a)} != {sorted(b)}"
        return next((d for k in a if (d := json_diff(a[k], b[k], f"{path}.{k}"))), None)
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} != {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := json_diff(x, y, f"{path}[{i}]"))), None)
    if isinstance(a, float):
        same = struct.pack("<d", a) == struct.pack("<d", b)
        return None if same else f"{path}: {a!r} != {b!r}"
    return None if a == b else f"{path}: {a!r} != {b!r}"


# ---- paths into the tree ----------------------------------------------------------------------
#
# A path is a tuple of steps from the root; `resolve` follows the same steps through the object
# torch.load returned:  ("item", i) list/tuple element, ("value", i) i-th value of a dict or of a
# REDUCE's dictitems (OrderedDict), ("attr", name) a str key of a BUILD state dict (an attribute),
# ("data",) the tensor inside torch._utils._rebuild_parameter (Parameter.data).

Step = tuple[Any, ...]


def tensor_nodes(node: Any, path: tuple[Step, ...] = ()) -> Iterator[tuple[tuple[Step, ...], dict[str, Any]]]:
    """Every {"tensor": ...} reachable through containers, object state and Parameters."""
    if isinstance(node, list):
        for i, v in enumerate(node):
            yield from tensor_nodes(v, path + (("item", i),))
    elif not isinstance(node, dict):
        return
    elif "tensor" in node:
        yield path, node["tensor"]
    elif "tuple" in node:
        for i, v in enumerate(node["tuple"]):
            yield from tensor_nodes(v, path + (("item", i),))
    elif "dict" in node:
        for i, (_, v) in enumerate(node["dict"]):
            yield from tensor_nodes(v, path + (("value", i),))
    elif "reduce" in node or "newobj" in node:
        for i, (_, v) in enumerate(node.get("dictitems", [])):
            yield from tensor_nodes(v, path + (("value", i),))
        state = node.get("state")
        if isinstance(state, dict) and "dict" in state:
            for k, v in state["dict"]:
                if isinstance(k, str):
                    yield from tensor_nodes(v, path + (("attr", k),))
        call = node.get("reduce")
        if call and call[0] == {"global": ["torch._utils", "_rebuild_parameter"]}:
            yield from tensor_nodes(call[1]["tuple"][0], path + (("data",),))


def str_key_path(path: tuple[Step, ...], tree: Any) -> str | None:
    """Keys joined with "." when `path` only crosses dict / OrderedDict entries with str keys."""
    keys, node = [], tree
    for step in path:
        if step[0] != "value" or not isinstance(node, dict):
            return None
        entries = node.get("dict", node.get("dictitems"))
        if entries is None or not isinstance(entries[step[1]][0], str):
            return None
        keys.append(entries[step[1]][0])
        node = entries[step[1]][1]
    return ".".join(keys) if keys else None


def resolve(obj: Any, path: tuple[Step, ...]) -> Any:
    for step in path:
        if step[0] == "item":
            obj = obj[step[1]]
        elif step[0] == "value":
            obj = list(obj.values())[step[1]]
        elif step[0] == "attr":
            obj = getattr(obj, step[1])
        else:
            obj = obj.data
    return obj
