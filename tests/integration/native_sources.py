"""Native DeepSpeed checkpoints the tests mount as sources (issue 15), and their ds_to_universal conversions.

Each is a folder engine.save_checkpoint wrote with real DeepSpeed 0.19.8 (holding `latest`): examples/tiny/native
(ZeRO-1, DP 2) and examples/tiny_llama_tp2/native (AutoTP TP 2), both committed with their conversion, and the
native re-saves kept in the goldens (ZeRO-1/2 fp32 and bf16 at DP 4, ZeRO-3 at DP 1 and 2), converted in the session
(conftest's `converted` fixture: `python -m deepspeed.checkpoint.ds_to_universal`, a few seconds each, once).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ds_reference import EXAMPLES

GOLDENS = EXAMPLES.parent / "tests" / "goldens"
# id -> the native folder (holding `latest`).
SOURCES = {
    "tiny-z1-dp2": EXAMPLES / "tiny" / "native",
    "z1-dp1-fp32": GOLDENS / "load_universal-tiny-z1-dp1-fp32" / "native_resaved",
    "z1-dp4-fp32": GOLDENS / "load_universal-tiny-z1-dp4-fp32" / "native_resaved",
    "z1-dp4-bf16": GOLDENS / "load_universal-tiny-z1-dp4-bf16" / "native_resaved",
    "z2-dp4-fp32": GOLDENS / "load_universal-tiny-z2-dp4-fp32" / "native_resaved",
    "z2-dp4-bf16": GOLDENS / "load_universal-tiny-z2-dp4-bf16" / "native_resaved",
    "z3-dp1-fp32": GOLDENS / "load_universal-tiny_zero3-z3-dp1-fp32" / "native_resaved",
    "z3-dp2-fp32": GOLDENS / "load_universal-tiny_zero3-z3-dp2-fp32" / "native_resaved",
    # AutoTP at TP 2 (affine_map splits along dim 0 and 1, replicated norms), committed with its conversion.
    "llama-tp2-z1": EXAMPLES / "tiny_llama_tp2" / "native",
}
# Conversions committed beside their native folder (the others are converted in the session).
COMMITTED_CONVERSIONS = {"tiny-z1-dp2": EXAMPLES / "tiny" / "universal",
                         "llama-tp2-z1": EXAMPLES / "tiny_llama_tp2" / "universal"}
CONVERT_TIMEOUT_S = 300


def convert(native: Path, out: Path) -> Path:
    """DeepSpeed's ds_to_universal of native's latest tag into out/<tag>_universal, with out/latest_universal;
    returns out. Asserts it succeeded."""
    tag = (native / "latest").read_text().strip()
    argv = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", native / tag,
            "--output_folder", out / f"{tag}_universal", "--num_extract_workers", "1",
            "--num_merge_workers", "1", "--inject_missing_state"]  # fmt: skip
    run = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (out / "latest_universal").write_text(f"{tag}_universal")
    return out
