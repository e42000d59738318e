"""Writes the seed corpora of the libFuzzer harnesses (tests/fuzz) from the committed checkpoints and fixtures.

usage: python3 tests/fuzz/make_seeds.py OUT_DIR

OUT_DIR/<harness>/ gets one file per seed, named by its sha1 (the name libFuzzer gives corpus files), so a seed
that two sources share is written once. Standard library only: scripts/fuzz.sh runs it with any python3.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The checkpoints fuzz_checkpoint starts from, in the order of its first input byte (fuzz_checkpoint.cc).
CHECKPOINT_CASES = [
    REPO / "examples/tiny/universal",
    REPO / "tests/fixtures/tiny_zero3/universal",
    REPO / "examples/tiny_llama_tp2/universal",
    REPO / "examples/tiny/native",
    REPO / "tests/goldens/load_universal-tiny_zero3-z3-dp2-fp32/native_resaved",
    REPO / "examples/tiny_llama_tp2/native",
]
# The parameter folders fuzz_param_state starts from, in the order of its first input byte (fuzz_param_state.cc).
PARAM_FOLDERS = [
    REPO / "examples/tiny/universal/global_step3_universal/zero/embed.weight",
    REPO / "tests/fixtures/tiny_zero3/universal/global_step3_universal/zero/fc1.weight",
    REPO / "examples/tiny_llama_tp2/universal/global_step3_universal/zero/model.embed_tokens.weight",
    REPO / "examples/tiny_llama_tp2/universal/global_step3_universal/zero/model.layers.0.self_attn.q_proj.weight",
    REPO / "tests/fixtures/ucp_edge/categories/zero/fc1.weight",
]
# Every torch.save file the seeds come from: the checkpoints above, the native ones, the good and bad fixtures.
TORCH_FILE_ROOTS = CHECKPOINT_CASES + [
    REPO / "tests/fixtures/ucp_bad",
    REPO / "tests/fixtures/ucp_edge",
]
# Larger inputs slow every execution and prove no more: libFuzzer's -max_len follows the largest seed.
MAX_SEED_BYTES = 64 << 10
# Targets fuzz_config starts from: the ds_config keys ResolveTarget reads, in the shapes DeepSpeed accepts.
DS_CONFIGS = [
    {},
    {"zero_optimization": {"stage": 1}, "train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
     "gradient_accumulation_steps": 2},
    {"zero_optimization": {"stage": 2, "round_robin_gradients": True}, "bf16": {"enabled": True}},
    {"zero_optimization": {"stage": 3, "sub_group_size": 1000}, "fp16": {"enabled": True},
     "tensor_parallel": {"autotp_size": 2, "tp_grain_size": 8}},
    {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
    {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4,
     "tensor_parallel": {"autotp_size": 2}, "bfloat16": {"enabled": True}},
]


# fuzz_safetensors: files laid out as the safetensors writer lays them out (safetensors_writer.h): dtype code,
# item size and shape per tensor.
SAFETENSORS_CASES = [
    [],
    [("w", "F32", 4, [2, 3])],
    [("a.weight", "F32", 4, [4]), ("b", "BF16", 2, [3]), ("c", "F16", 2, []), ("m", "BOOL", 1, [1])],
    [("step", "I64", 8, []), ("empty", "F32", 4, [0, 5])],
]


def safetensors_file(tensors: list[tuple[str, str, int, list[int]]], metadata: dict[str, str]) -> bytes:
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, code, itemsize, shape in tensors:
        numel = 1
        for d in shape:
            numel *= d
        header[name] = {"dtype": code, "shape": shape, "data_offsets": [offset, offset + numel * itemsize]}
        offset += numel * itemsize
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + bytes(range(256)) * (offset // 256) + bytes(offset % 256)


def safetensors_seeds() -> list[bytes]:
    return [safetensors_file(case, metadata) for case in SAFETENSORS_CASES for metadata in ({}, {"format": "pt"})]


def torch_files() -> list[Path]:
    files = []
    for root in TORCH_FILE_ROOTS:
        files += [p for p in sorted(root.rglob("*")) if p.is_file() and zipfile.is_zipfile(p)]
    return files


def pickles_of(path: Path) -> list[bytes]:
    with zipfile.ZipFile(path) as archive:
        return [archive.read(n) for n in archive.namelist() if n.endswith(".pkl")]


def write(out: Path, harness: str, data: bytes) -> bool:
    if len(data) > MAX_SEED_BYTES:
        return False
    folder = out / harness
    folder.mkdir(parents=True, exist_ok=True)
    (folder / hashlib.sha1(data).hexdigest()).write_bytes(data)
    return True


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    for path in torch_files():
        whole = path.read_bytes()
        write(out, "fuzz_zip", whole)
        write(out, "fuzz_torch_archive", whole)
        for pickle in pickles_of(path):
            write(out, "fuzz_pickle", pickle)
    # fuzz_checkpoint, fuzz_param_state: [template index][file index in the sorted file list of the
    # template][the file's new bytes].
    for harness, templates in (("fuzz_checkpoint", CHECKPOINT_CASES), ("fuzz_param_state", PARAM_FOLDERS)):
        for case, root in enumerate(templates):
            names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
            for index, name in enumerate(names[:256]):
                write(out, harness, bytes([case, index]) + (root / name).read_bytes())
    # fuzz_config: the ds_config text, NUL, the Hugging Face config text.
    model_config = (REPO / "examples/tiny_llama_tp2/config.json").read_bytes()
    for ds_config in DS_CONFIGS:
        text = json.dumps(ds_config).encode()
        write(out, "fuzz_config", text)
        write(out, "fuzz_config", text + b"\0" + model_config)
    for seed in safetensors_seeds():
        write(out, "fuzz_safetensors", seed)
    for harness in sorted(p.name for p in out.iterdir()):
        print(f"seeds: {harness}: {sum(1 for _ in (out / harness).iterdir())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
