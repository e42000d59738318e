#!/usr/bin/env python3
"""Check that examples/tiny/universal is a real, loadable DeepSpeed universal checkpoint.

    DS_ACCELERATOR=cpu /opt/reshardfs/venv/bin/python examples/check_tiny_checkpoint.py

Two runs with the same TinyModel / config / data as make_tiny_checkpoint.py:
  A. native:    DP=<source dp> processes, engine.load_checkpoint(<dir>/native)         (same layout)
  B. universal: DP=1 process, config "checkpoint": {"load_universal": true},
                engine.load_checkpoint(<dir>/universal)   (tag from latest_universal)
Each records: global_steps, scheduler lr, optimizer step, the eval loss of the next batch right after
loading, the training losses of --steps further steps, and the final fp32 weights.
Before that, a static check: every zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt must equal, bit for bit,
the slice of the native ZeRO flat partitions that holds <name>.
Exits non-zero if anything disagrees (beyond float noise from the different DP reduction order).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_tiny_checkpoint as tiny  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=os.path.join(HERE, "tiny"), help="dir with native/ and universal/")
    ap.add_argument("--zero-stage", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3, help="training steps after loading")
    ap.add_argument("--bf16", action="store_true", help="the checkpoint was made with --bf16")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--worker", choices=["native", "universal"], help=argparse.SUPPRESS)
    ap.add_argument("--dp", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def base_optimizer(engine):
    opt = engine.optimizer
    return opt.optimizer if hasattr(opt, "optimizer") else opt


def worker(args):
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    model = tiny.build_model()
    universal = args.worker == "universal"
    # Perturb the fresh weights so that a load that silently does nothing cannot pass.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    engine, _, scheduler = tiny.init_deepspeed(model, args.dp, args.zero_stage, args.bf16, load_universal=universal)
    ckpt = os.path.join(args.dir, "universal" if universal else "native")
    load_path, client_state = engine.load_checkpoint(ckpt)  # tag=None -> latest / latest_universal
    assert load_path is not None, f"load_checkpoint({ckpt}) found nothing"
    rank = dist.get_rank()
    base = base_optimizer(engine)
    step_val = tiny.optimizer_step(base)
    res = {
        "mode": args.worker,
        "dp": args.dp,
        "load_path": load_path,
        "global_steps": engine.global_steps,
        "lr": [g["lr"] for g in base.param_groups],
        "optimizer_step": float(step_val),
        "optimizer_step_type": f"{type(step_val).__module__}.{type(step_val).__name__}",
        "eval_loss_after_load": tiny.eval_loss(engine, engine.global_steps, args.dp),
        "train_losses": [],
    }
    start = engine.global_steps
    for s in range(start, start + args.steps):
        res["train_losses"].append(tiny.train_step(engine, s, args.dp))
    res["lr_after"] = [g["lr"] for g in base.param_groups]
    if rank == 0:
        weights = {k: v.detach().float().clone() for k, v in engine.module.state_dict().items()}
        torch.save(weights, args.result + ".pt")
        with open(args.result, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def run(mode, dp, args, tmp):
    result = os.path.join(tmp, f"{mode}.json")
    fwd = ["--worker", mode, "--dp", str(dp), "--dir", args.dir, "--zero-stage", str(args.zero_stage),
           "--steps", str(args.steps), "--result", result] + (["--bf16"] if args.bf16 else [])
    subprocess.run(tiny.torchrun_cmd(dp, os.path.abspath(__file__), fwd), env=tiny.cpu_env(), check=True)
    with open(result) as f:
        res = json.load(f)
    res["weights"] = torch.load(result + ".pt", weights_only=True)
    return res


def native_model_states(nat):
    """The first model-states file of a native tag folder (ZeRO-1/2: mp_rank_00_..., ZeRO-3: zero_pp_rank_0_...)."""
    for fn in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        if os.path.exists(os.path.join(nat, fn)):
            return torch.load(os.path.join(nat, fn), weights_only=False)
    raise FileNotFoundError(f"no model states file in {nat}")


def static_check(d):
    """Bit-exact: every zero/<name>/{fp32,exp_avg,exp_avg_sq,step}.pt of the universal checkpoint equals
    the slice of the native ZeRO-1/2 flat partitions (concatenated over DP ranks) that holds <name>."""
    import glob
    with open(os.path.join(d, "native", "latest")) as f:
        tag = f.read().strip()
    with open(os.path.join(d, "universal", "latest_universal")) as f:
        utag = f.read().strip()
    nat, uni = os.path.join(d, "native", tag), os.path.join(d, "universal", utag, "zero")
    ms = native_model_states(nat)
    files = sorted(glob.glob(os.path.join(nat, "*zero_pp_rank_*_mp_rank_00_optim_states.pt")),
                   key=lambda p: int(os.path.basename(p).split("zero_pp_rank_")[1].split("_")[0]))
    osds = [torch.load(f, weights_only=False)["optimizer_state_dict"] for f in files]
    if int(osds[0].get("zero_stage", 1)) > 2:
        print("SKIP universal zero/* == native partitions (only implemented for ZeRO-1/2)")
        return True
    bad, n = [], 0
    for g, shapes in enumerate(ms["param_shapes"]):
        flat = {
            "fp32": torch.cat([o["single_partition_of_fp32_groups"][g] for o in osds]),
            "exp_avg": torch.cat([o["base_optimizer_state"]["state"][g]["exp_avg"] for o in osds]),
            "exp_avg_sq": torch.cat([o["base_optimizer_state"]["state"][g]["exp_avg_sq"] for o in osds]),
        }
        pads = osds[0].get("param_alignment_paddings", [[0] * len(shapes)] * len(ms["param_shapes"]))[g]
        step = osds[0]["base_optimizer_state"]["state"][g]["step"]
        off = 0
        for (name, shape), pad in zip(shapes.items(), pads):
            numel = shape.numel()
            for key, t in flat.items():
                u = torch.load(os.path.join(uni, name, f"{key}.pt"), weights_only=False)
                u = u["param"] if isinstance(u, dict) else u
                n += 1
                if tuple(u.shape) != tuple(shape) or not torch.equal(u.reshape(-1), t[off:off + numel]):
                    bad.append(f"{name}/{key}")
            us = torch.load(os.path.join(uni, name, "step.pt"), weights_only=False)
            n += 1
            if float(us) != float(step) or type(us) is not type(step):
                bad.append(f"{name}/step")
            off += numel + pad
    print(f"{'OK  ' if not bad else 'FAIL'} universal zero/* == native partitions (bit-exact, {n} tensors)"
          + (f": {bad}" if bad else ""))
    return not bad


def close(a, b, rtol):
    return abs(a - b) <= rtol * max(1.0, abs(a), abs(b))


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    args.dir = os.path.abspath(args.dir)
    static_ok = static_check(args.dir)
    # the source DP degree, from the native model states
    with open(os.path.join(args.dir, "native", "latest")) as f:
        tag = f.read().strip()
    ms = native_model_states(os.path.join(args.dir, "native", tag))
    src_dp = ms["dp_world_size"]
    with tempfile.TemporaryDirectory() as tmp:
        a = run("native", src_dp, args, tmp)
        b = run("universal", 1, args, tmp)
    ok = static_ok

    def report(what, x, y, good):
        nonlocal ok
        ok &= bool(good)
        print(f"{'OK  ' if good else 'FAIL'} {what:28s} native(dp={src_dp}): {x}   universal(dp=1): {y}")

    report("global_steps", a["global_steps"], b["global_steps"], a["global_steps"] == b["global_steps"])
    report("optimizer step", f'{a["optimizer_step"]} ({a["optimizer_step_type"]})',
           f'{b["optimizer_step"]} ({b["optimizer_step_type"]})', a["optimizer_step"] == b["optimizer_step"])
    report("lr after load", a["lr"], b["lr"], all(close(x, y, 1e-12) for x, y in zip(a["lr"], b["lr"])))
    report("eval loss after load", f'{a["eval_loss_after_load"]:.8f}', f'{b["eval_loss_after_load"]:.8f}',
           close(a["eval_loss_after_load"], b["eval_loss_after_load"], args.rtol))
    for i, (x, y) in enumerate(zip(a["train_losses"], b["train_losses"])):
        report(f"train loss step {a['global_steps'] + i + 1}", f"{x:.8f}", f"{y:.8f}", close(x, y, args.rtol))
    report("lr after resumed steps", a["lr_after"], b["lr_after"],
           all(close(x, y, 1e-12) for x, y in zip(a["lr_after"], b["lr_after"])))
    wa, wb = a["weights"], b["weights"]
    maxdiff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    if args.bf16:
        # bf16 weights: allow a 1-ulp flip (relative 2^-8) from the different gradient reduction order
        wok = all(((wa[k] - wb[k]).abs() <= 2**-7 * torch.maximum(wa[k].abs(), wb[k].abs()) + 1e-6).all() for k in wa)
    else:
        wok = maxdiff <= 1e-5
    report("max |w_native - w_univ|", "", f"{maxdiff:.3e}", set(wa) == set(wb) and wok)
    print("PASS" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
