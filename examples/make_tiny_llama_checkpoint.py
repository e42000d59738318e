#!/usr/bin/env python3
"""Regenerate examples/tiny_llama_tp2/: a tiny, real DeepSpeed AutoTP (tensor-parallel) ZeRO
checkpoint of a transformers LlamaForCausalLM, and its universal conversion made by DeepSpeed's own
ds_to_universal.

    DS_ACCELERATOR=cpu /opt/reshardfs/venv/bin/python examples/make_tiny_llama_checkpoint.py

What it does:
  1. re-launches itself under `python -m torch.distributed.run --nproc_per_node=<tp*dp>` (CPU, gloo);
  2. each rank builds the same tiny LlamaForCausalLM (--model: another of MODELS, e.g. qwen2_tied, the
     same sizes plus q/k/v biases and a tied head) (fixed seed, fp32; hidden 64, 2 layers,
     4 heads, 2 KV heads, intermediate 128, vocab 128, untied lm_head), DeepSpeed with
     "tensor_parallel": {"autotp_size": tp}, ZeRO-<stage>, torch AdamW with two param groups,
     WarmupLR; trains --steps steps on deterministic token batches;
  3. engine.save_checkpoint(<out>/native)  -> <out>/native/global_step<steps>/ + <out>/native/latest;
     then (not saved) evaluates the next batch and trains REF_STEPS more steps, and writes those
     losses to <out>/reference_losses.json (what a correct resume must reproduce), and the model's
     config.json;
  4. runs `python -m deepspeed.checkpoint.ds_to_universal --input_folder <out>/native/<tag>
     --output_folder <out>/universal/<tag>_universal --num_extract_workers 1 --num_merge_workers 1`
     (--inject_missing_state only at TP 1: AutoTP stores its own universal_checkpoint_info), which also
     writes <out>/universal/latest_universal;
  5. removes <out>/native/zero_to_fp32.py and zero_to_torch.py.

`--load-check --tp T --dp D` instead loads <out>/universal with DeepSpeed's own load_universal at the
layout T x D (a perturbed model, so a load that does nothing cannot pass), then repeats step 3's
evaluation and REF_STEPS training steps and compares the losses with <out>/reference_losses.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_tiny_checkpoint import (REDUCE_BUCKET_ELEMENTS, cpu_env, finish_output, optimizer_step,  # noqa: E402
                                  to_universal, torchrun_cmd)

VOCAB = 128
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 128
SEQ = 16
GLOBAL_BATCH = 4  # sequences per optimizer step, over all DP ranks
SEED = 1234
DATA_SEED = 4321
REF_STEPS = 2  # training steps after the save, recorded in reference_losses.json
LOSS_RTOL = 1e-4


# Phi3's MLP under AutoTP: gate_up_proj is [gate; up] fused along dim 0, split sub-parameter by sub-parameter
# (each rank its share of gate and its share of up), and down_proj row-parallel. Its attention stays whole:
# transformers' Phi3Attention cuts qkv_proj by the config's full head counts, so it cannot run on a TP shard.
PHI3_PARTITION = {
    "use_default_specs": False,
    "layer_specs": [
        {"patterns": [r".*\.mlp\.gate_up_proj\.weight$"], "partition_type": "column", "shape": [2, -1],
         "partition_dim": 0},
        {"patterns": [r".*\.mlp\.down_proj\.weight$"], "partition_type": "row"},
    ],
}

# --model: what the example can build, as (transformers config class, model class, config fields that differ
# from the Llama defaults above, "tensor_parallel" fields of its ds_config). qwen2_tied is Llama's layout plus
# q/k/v biases and an lm_head tied to the embedding (the test suite resumes it at another TP through reshardfs'
# built-in AutoTP rules); phi3 has a fused gate_up_proj, split as PHI3_PARTITION says; llama_frozen is Llama with
# every attention projection frozen (FROZEN_PATTERN, build_model), as a LoRA run freezes its base weights: AutoTP
# still splits them (q/k/v by column, o by row), and no optimizer owns them.
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, {}),
    "llama_frozen": ("LlamaConfig", "LlamaForCausalLM", {}, {}),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}, {}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}, {"partition_config": PHI3_PARTITION}),
}


def llama_config(model="llama"):
    import transformers
    fields = dict(vocab_size=VOCAB,
                  hidden_size=HIDDEN,
                  intermediate_size=INTERMEDIATE,
                  num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS,
                  max_position_embeddings=2 * SEQ,
                  tie_word_embeddings=False,
                  use_cache=False,
                  attn_implementation="eager")
    fields.update(MODELS[model][2])
    return getattr(transformers, MODELS[model][0])(**fields)


FROZEN_PATTERN = ".self_attn."  # the parameters llama_frozen freezes


def build_model(model="llama"):
    import transformers
    torch.manual_seed(SEED)
    built = getattr(transformers, MODELS[model][1])(llama_config(model))
    if model == "llama_frozen":
        for name, p in built.named_parameters():
            if FROZEN_PATTERN in name:
                p.requires_grad_(False)
    return built


def param_groups(model):
    """group 0: 2-D weights except the embedding (lr 1e-3, wd 0.01); group 1: embedding + RMSNorm
    weights (lr 5e-4, wd 0)."""
    g0, g1 = [], []
    for name, p in model.named_parameters():
        (g0 if (p.dim() == 2 and "embed_tokens" not in name) else g1).append(p)
    return [
        {"params": g0, "lr": 1e-3, "weight_decay": 0.01},
        {"params": g1, "lr": 5e-4, "weight_decay": 0.0},
    ]


def ds_config(tp, dp, zero_stage, bf16=False, load_universal=False, bf16_optimizer=False, model="llama"):
    """bf16_optimizer: bf16 weights with fp32 gradient accumulation at ZeRO-1, which DeepSpeed runs with its
    BF16_Optimizer instead of the ZeRO-1 optimizer. model: adds that model's "tensor_parallel" fields."""
    cfg = {
        # No train_batch_size (as in DeepSpeed's AutoTP training tutorial): DeepSpeedConfig checks
        # train_batch_size == micro * grad_acc * world_size with world_size = ALL ranks (TP x DP; no
        # mpu is known yet), so GLOBAL_BATCH would be rejected for TP > 1. DeepSpeed derives
        # train_batch_size = micro * TP * DP, which only feeds the global_samples counter.
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // dp,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01, "torch_adam": True},
        },
        "scheduler": {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 1e-5, "warmup_num_steps": 10, "warmup_type": "linear"},
        },
        "zero_optimization": {"stage": zero_stage, "reduce_bucket_size": REDUCE_BUCKET_ELEMENTS},
        "tensor_parallel": {"autotp_size": tp, **MODELS[model][3]},
        "bf16": {"enabled": bool(bf16)},
        "fp16": {"enabled": False},
    }
    if bf16_optimizer:
        assert zero_stage == 1, "DeepSpeed runs BF16_Optimizer only at ZeRO stage 1"
        cfg["bf16"]["enabled"] = True
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    if load_universal:
        cfg["checkpoint"] = {"load_universal": True}
    return cfg


def global_batch(step):
    """Token ids [GLOBAL_BATCH, SEQ] of optimizer step `step`: a random start token per sequence, then
    t[i+1] = (3 t[i] + 1) mod VOCAB (learnable). HF shifts labels = input_ids internally."""
    g = torch.Generator().manual_seed(DATA_SEED + step)
    start = torch.randint(0, VOCAB, (GLOBAL_BATCH, 1), generator=g)
    cols = [start]
    for _ in range(SEQ - 1):
        cols.append((cols[-1] * 3 + 1) % VOCAB)
    return torch.cat(cols, dim=1)


def local_batch(step):
    from deepspeed.utils import groups
    dp_rank, dp = groups._get_data_parallel_rank(), groups._get_data_parallel_world_size()
    n = GLOBAL_BATCH // dp
    return global_batch(step)[dp_rank * n:(dp_rank + 1) * n]


def global_mean(t):
    # every TP rank of a DP replica holds the same loss, so the mean over all ranks is the DP mean
    import torch.distributed as dist
    t = t.float().clone()
    dist.all_reduce(t)
    return (t / dist.get_world_size()).item()


def train_step(engine, step):
    tokens = local_batch(step)
    loss = engine(input_ids=tokens, labels=tokens).loss
    engine.backward(loss)
    engine.step()
    return global_mean(loss.detach())


def eval_loss(engine, step):
    tokens = local_batch(step)
    with torch.no_grad():
        loss = engine(input_ids=tokens, labels=tokens).loss
    return global_mean(loss.detach())


def init_engine(model, args, load_universal=False):
    import deepspeed
    deepspeed.init_distributed(dist_backend="gloo")
    engine, _, _, scheduler = deepspeed.initialize(model=model,
                                                   model_parameters=param_groups(model),
                                                   config=ds_config(args.tp, args.dp, args.zero_stage, args.bf16,
                                                                    load_universal,
                                                                    getattr(args, "bf16_optimizer", False),
                                                                    args.model))
    return engine, scheduler


def after_save(engine, scheduler, first_step):
    """Eval loss of batch `first_step`, then REF_STEPS training steps: the resume reference."""
    out = {"eval_loss": eval_loss(engine, first_step), "train_losses": []}
    for s in range(first_step, first_step + REF_STEPS):
        out["train_losses"].append(train_step(engine, s))
    out["lr_after"] = scheduler.get_last_lr()
    return out


# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "tiny_llama_tp2"), help="default examples/tiny_llama_tp2")
    ap.add_argument("--tp", type=int, default=2, help="AutoTP degree (autotp_size)")
    ap.add_argument("--dp", type=int, default=1, help="data parallel degree (must divide 4)")
    ap.add_argument("--zero-stage", type=int, default=1, choices=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="bf16 model weights (default fp32)")
    ap.add_argument("--model", default="llama", choices=list(MODELS),
                    help="default llama; qwen2_tied: Qwen2ForCausalLM (q/k/v biases, lm_head tied); "
                         "phi3: Phi3ForCausalLM (fused gate_up_proj)")
    ap.add_argument("--load-check", action="store_true",
                    help="load <out>/universal at --tp x --dp with load_universal and compare resume losses")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def make_worker(args):
    import deepspeed
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    engine, scheduler = init_engine(build_model(args.model), args)
    rank = dist.get_rank()
    if rank == 0:
        base = engine.optimizer.optimizer
        print(f"[make] deepspeed {deepspeed.__version__} torch {torch.__version__}")
        print(f"[make] ZeRO wrapper: {type(engine.optimizer).__module__}.{type(engine.optimizer).__name__}")
        print(f"[make] base optimizer: {type(base).__module__}.{type(base).__name__}")
        show = ["model.embed_tokens", "model.norm", "lm_head", "model.layers.0.input_layernorm"]
        show += [f"model.layers.0.self_attn.{x}_proj" for x in "qkvo"]
        show += [f"model.layers.0.mlp.{x}_proj" for x in ("gate", "up", "down")]
        mods = dict(engine.module.named_modules())
        show += ["model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj"]  # phi3's fused layers
        for n in (n for n in show if n in mods):
            print(f"[make] module {n}: {type(mods[n]).__module__}.{type(mods[n]).__name__}")
        for n, p in engine.module.named_parameters():
            print(f"[make] rank0 param {n} {tuple(p.shape)} {p.dtype}")
    for step in range(args.steps):
        loss = train_step(engine, step)
        if rank == 0:
            print(f"[make] step {step + 1}: loss {loss:.8f} lr {scheduler.get_last_lr()}")
    engine.save_checkpoint(os.path.join(args.out, "native"))  # tag = global_step<N>
    if rank == 0:
        s = optimizer_step(engine.optimizer.optimizer)
        print(f"[make] optimizer state['step'] = {s!r}")
    ref = after_save(engine, scheduler, args.steps)
    if rank == 0:
        ref["layout"] = {"tp": args.tp, "dp": args.dp, "zero_stage": args.zero_stage, "bf16": args.bf16}
        print(f"[make] reference after save: {ref}")
        with open(os.path.join(args.out, "reference_losses.json"), "w") as f:
            json.dump(ref, f, indent=1, sort_keys=True)
            f.write("\n")
        # The model's Hugging Face config, as a run folder holds it: `reshardfs --model-config` reads
        # its num_key_value_heads for AutoTP's shard sizes.
        llama_config(args.model).to_json_file(os.path.join(args.out, "config.json"))
    dist.barrier()
    dist.destroy_process_group()


def load_worker(args):
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    model = build_model(args.model)
    with torch.no_grad():  # a load that silently does nothing must not pass
        for p in model.parameters():
            p.add_(0.5)
    engine, scheduler = init_engine(model, args, load_universal=True)
    rank = dist.get_rank()
    load_path, _ = engine.load_checkpoint(os.path.join(args.out, "universal"))
    assert load_path is not None, "load_checkpoint found nothing"
    s = optimizer_step(engine.optimizer.optimizer)
    if rank == 0:
        print(f"[load] tp={args.tp} dp={args.dp}: loaded {load_path}; global_steps={engine.global_steps} "
              f"optimizer step={s!r} group lr={[g['lr'] for g in engine.optimizer.param_groups]}")
    got = after_save(engine, scheduler, engine.global_steps)
    if rank == 0:
        with open(os.path.join(args.out, "reference_losses.json")) as f:
            ref = json.load(f)
        ok = True
        pairs = [("eval loss after load", ref["eval_loss"], got["eval_loss"])]
        pairs += [(f"train loss step {engine.global_steps - REF_STEPS + i + 1}", a, b)
                  for i, (a, b) in enumerate(zip(ref["train_losses"], got["train_losses"]))]
        for what, a, b in pairs:
            good = abs(a - b) <= LOSS_RTOL * abs(a)
            ok &= good
            print(f"[load] {'OK  ' if good else 'FAIL'} {what:24s} saved run: {a:.8f}  loaded: {b:.8f}")
        good = all(abs(a - b) <= 1e-9 for a, b in zip(ref["lr_after"], got["lr_after"]))
        ok &= good
        print(f"[load] {'OK  ' if good else 'FAIL'} lr after resumed steps  saved run: {ref['lr_after']}  "
              f"loaded: {got['lr_after']}")
        print("[load] PASS" if ok else "[load] FAIL")
        if not ok:
            sys.exit(1)
    dist.barrier()
    dist.destroy_process_group()


def fwd_args(args):
    return ["--worker", "--out", args.out, "--tp", str(args.tp), "--dp", str(args.dp), "--zero-stage",
            str(args.zero_stage), "--steps", str(args.steps), "--model", args.model] + \
           (["--bf16"] if args.bf16 else []) + \
           (["--load-check"] if args.load_check else [])


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return load_worker(args) if args.load_check else make_worker(args)
    args.out = os.path.abspath(args.out)
    assert GLOBAL_BATCH % args.dp == 0, f"--dp must divide {GLOBAL_BATCH}"
    env = cpu_env()
    script = os.path.abspath(__file__)
    if args.load_check:
        subprocess.run(torchrun_cmd(args.tp * args.dp, script, fwd_args(args)), env=env, check=True)
        return
    for sub in ("native", "universal"):
        shutil.rmtree(os.path.join(args.out, sub), ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    subprocess.run(torchrun_cmd(args.tp * args.dp, script, fwd_args(args)), env=env, check=True)

    native = os.path.join(args.out, "native")
    # With TP > 1, AutoTP attaches universal_checkpoint_info to the model and save_checkpoint stores
    # it in every mp_rank_XX_model_states.pt. A TP 1 run has no AutoTP layers and stores none, so
    # the converter must inject it, as for any plain model.
    to_universal(native, os.path.join(args.out, "universal"), inject_missing_state=args.tp == 1)
    finish_output(args.out)


if __name__ == "__main__":
    main()
