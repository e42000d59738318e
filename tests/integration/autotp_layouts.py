"""What the pinned DeepSpeed's AutoTP does to each Hugging Face decoder family reshardfs has built-in rules for.

record(out_dir, tp) launches `tp` CPU processes (gloo, ds_launch.launch), running this file as a
worker. For every model of FAMILIES (tiny, fixed seed, fp32, 6 query and 3 KV heads so that the KV-aware shard
sizes are uneven at TP 2; each family with an untied and a tied output head), each rank builds the model, runs
the unmodified deepspeed.initialize with "tensor_parallel": {"autotp_size": tp} (ZeRO-1, the Llama example's
config), and writes

  out_dir/<family>_rank_<r>.pt   the rank's module state_dict: every AutoTP-local tensor, a tied lm_head included
  out_dir/<family>_full.pt       (rank 0) the module state_dict as built, before AutoTP
  out_dir/layouts.json           (rank 0) layouts_document(): per family, the model config as save_pretrained
                                 writes it (to_diff_dict), its config class's defaults and, per parameter,
                                 the split AutoTP recorded in its affine_map (each named parameter: not a tied
                                 alias such as a tied lm_head.weight; the model's
                                 universal_checkpoint_info, which an AutoTP run saves into its checkpoint)

`python tests/integration/autotp_layouts.py --write FILE` records at TP 2 and writes layouts.json to FILE: that
is how tests/unit/layout/autotp_layouts.json, the table the C++ unit test checks the built-in rules against,
is made. tests/integration/test_autotp_layouts.py records again with the installed DeepSpeed and requires the
same document, so the committed table cannot drift from the pinned package.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ds_launch import launch
from ds_reference import EXAMPLES

sys.path.insert(0, str(EXAMPLES))
import make_tiny_llama_checkpoint as llama  # noqa: E402

SEED = 2024
# Sizes shared by every family: head_dim 16, 6 query heads, 3 KV heads.
DIMS = dict(vocab_size=128, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=3, max_position_embeddings=32, use_cache=False)
# family id: (transformers config class, extra config fields). "llama" turns on every optional bias
# (attention_bias: q/k/v/o, mlp_bias: gate/up/down) so the bias rules are recorded too; qwen2 has q/k/v biases
# of its own; qwen3 adds per-head q_norm/k_norm weights; gemma2 and gemma3_text add pre/post feed-forward norms
# (gemma3_text also q_norm/k_norm); cohere has no post-attention norm (parallel attention and MLP); olmo's norms
# hold no weights; starcoder2 names its MLP c_fc/c_proj and has biases everywhere, norms included. Each family
# also as "<id>_tied", with tie_word_embeddings (lm_head shares the embedding's weight). Not here: olmo2, whose
# HF tp_plan DeepSpeed 0.19.8's AutoTP rejects as a whole ("unsupported partition style(s): ['rowwise_rep']").
_UNTIED: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "mistral": ("MistralConfig", {"sliding_window": None}),
    "qwen2": ("Qwen2Config", {}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "gemma": ("GemmaConfig", {"head_dim": 16}),
    "gemma2": ("Gemma2Config", {"head_dim": 16}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16}),
    "granite": ("GraniteConfig", {}),
    "cohere": ("CohereConfig", {}),
    "olmo": ("OlmoConfig", {}),
    "starcoder2": ("Starcoder2Config", {}),
}
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    **{f: (cls, {**extra, "tie_word_embeddings": False}) for f, (cls, extra) in _UNTIED.items()},
    **{f"{f}_tied": (cls, {**extra, "tie_word_embeddings": True}) for f, (cls, extra) in _UNTIED.items()},
}


def model_config(family: str) -> Any:
    import transformers
    cls, extra = FAMILIES[family]
    return getattr(transformers, cls)(**DIMS, **extra, attn_implementation="eager")


def build_model(family: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    torch.manual_seed(SEED)
    return AutoModelForCausalLM.from_config(model_config(family))


def split_of(entry: dict[str, Any]) -> dict[str, Any]:
    """One affine_map entry (ParamAffineMap.to_dict()) as {shape, split_dim, shard_sizes}: the dim along
    which the ranks' shards differ from the whole tensor (None: every rank holds it whole) and each rank's
    extent along it, in rank order. Fails on a map that is not one contiguous block per rank."""
    shape = list(entry["logical_shape"])
    ranks = [entry["ranks"][r] for r in sorted(entry["ranks"], key=int)]
    dims = {d for r in ranks for d, n in enumerate(r["shard_shape"]) if n != shape[d]}
    assert len(dims) <= 1 and all(len(r["pieces"]) == 1 for r in ranks), f"not a plain split: {entry}"
    dim = dims.pop() if dims else None
    return {"shape": shape, "split_dim": dim,
            "shard_sizes": [r["shard_shape"][dim] for r in ranks] if dim is not None else None}


def layouts_document(tp: int, layouts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import deepspeed
    import transformers
    return {"deepspeed": deepspeed.__version__, "transformers": transformers.__version__, "tp_size": tp,
            "families": layouts}


def record(out_dir: Path, tp: int = 2) -> Path:
    """Runs the workers; returns out_dir. Raises RuntimeError with the failing rank's traceback on failure."""
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = [out_dir / "layouts.json"] + [out_dir / f"{f}_rank_{r}.pt" for f in FAMILIES for r in range(tp)]
    launch(tp, Path(__file__), ["--worker", "--out", out_dir.resolve()],
           f"autotp_layouts: {len(FAMILIES)} families at AutoTP TP {tp}", expected)
    return out_dir


# ---- worker (one per rank) -------------------------------------------------------------------


def _family_layout(family: str, out: Path, tp: int, rank: int) -> dict[str, Any]:
    import deepspeed
    model = build_model(family)
    if rank == 0:
        torch.save({n: t.clone() for n, t in model.state_dict().items()}, out / f"{family}_full.pt")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=llama.param_groups(model),
                                           config=llama.ds_config(tp, 1, 1))
    torch.save({n: t.clone() for n, t in engine.module.state_dict().items()}, out / f"{family}_rank_{rank}.pt")
    info = getattr(engine.module, "universal_checkpoint_info")
    maps = info["affine_map"]["params"]
    params = {}
    for name, _ in engine.module.named_parameters():
        pattern = next((p for p in maps if p == f"^{name.replace('.', chr(92) + '.')}$"), None)
        assert pattern is not None, f"{family}: no affine_map entry for {name}"
        params[name] = split_of(maps[pattern])
    return {"model_type": model_config(family).model_type, "config": model_config(family).to_diff_dict(),
            "config_defaults": config_defaults(family), "params": params}


def config_defaults(family: str) -> dict[str, Any]:
    """The family's config-class defaults of the fields reshardfs reads from a config.json, which
    save_pretrained (to_diff_dict, as "config" above) leaves out when they are equal: num_key_value_heads None
    means the class takes num_attention_heads."""
    import inspect
    import transformers
    cls = getattr(transformers, FAMILIES[family][0])
    signature = inspect.signature(cls.__init__).parameters
    return {"tie_word_embeddings": cls().tie_word_embeddings,
            "num_attention_heads": signature["num_attention_heads"].default,
            "num_key_value_heads": signature["num_key_value_heads"].default}


def _worker(args: argparse.Namespace) -> None:
    import deepspeed
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    out, tp, rank = Path(args.out), dist.get_world_size(), dist.get_rank()
    layouts = {family: _family_layout(family, out, tp, rank) for family in FAMILIES}
    if rank == 0:
        (out / "layouts.json").write_text(json.dumps(layouts_document(tp, layouts), indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--write", type=Path, help="record at TP 2 and write the layouts document to this file")
    cli = ap.parse_args()
    if cli.worker:
        _worker(cli)
    elif cli.write:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copyfile(record(Path(tmp)) / "layouts.json", cli.write)
    else:
        ap.error("pass --write FILE")
