#!/usr/bin/python3
"""zest against PyTorch on the CPU, side by side in one run: the same GPT (torch_reference.py's
model, the one the parity fixtures are made with), the same text as byte tokens in zest's data
order, the same batch (--rows sequences per rank), AdamW with zest's parameter groups and
gradient clipping 1.0, at each shape and rank count:

  zest-s0 / zest-s3   zest-train, ZeRO stage 0 / 3, ranks as threads of one process (local)
  ddp                 torch DDP over gloo, one process per rank
  zero                torch DDP + ZeroRedundancyOptimizer(AdamW), one process per rank
  base-s0 / base-s3   as zest-s*, with the zest-train given by --baseline (before a change)

Threads: torch runs processes of --torch-threads threads each (1 by default: with more, its
OpenMP threads spin-wait, which on a shared or oversubscribed machine costs it 5-10x); zest
decides its own (one BLAS thread per rank when ranks > 1, every core for one rank). The runs are
interleaved (shape, ranks, then each system in an order rotated every repeat and reversed every
other one, so that no system always follows another) and repeated, since the machine may be
shared; the table gives medians over repeats and the load average seen around the runs.

  step_ms       median over the timed steps (after --warmup) of rank 0's step: zero_grad +
                forward + backward (+ all-reduce) + clip + optimizer step (zest: its metrics'
                step_ms, the same work plus the stage's collectives)
  tokens_per_s  ranks · rows · seq_len / step_ms
  rss_MiB       peak resident set per rank (wait4's ru_maxrss of each process; zest's ranks share
                one process, so its figure is the process's peak / ranks)

Not part of the build, the tests or CI: needs Debian's python3-torch (/usr/bin/python3).

    torch_cpu_bench.py --zest-train build/bin/zest-train [--shapes small,default,mid]
                       [--ranks 1,4] [--repeats 3] [--steps 12] [--warmup 3] [--rows 4]
                       [--systems zest-s0,zest-s3,ddp,zero] [--baseline ZEST_TRAIN]
                    [--env KEY=VALUE ...] [--zest-env KEY=VALUE ...] [--jsonl FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(ROOT, "configs", "corpus", "stories.txt")
CONFIG = os.path.join(ROOT, "configs", "default.json")
SEED = 1234

SHAPES = {  # n_layer, n_head, n_embd, seq_len, vocab_size (issue 22's shapes)
    "small": (3, 4, 48, 32, 256),
    "default": (4, 4, 256, 128, 256),
    "mid": (6, 6, 192, 64, 256),
    "vocab50k": (4, 4, 256, 128, 50257),
}
SYSTEMS = ["zest-s0", "zest-s3", "ddp", "zero", "base-s0", "base-s3"]


def wait_rss_mib(process):
    """Waits for a Popen and returns (status, its peak RSS in MiB) from wait4."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss / 1024.0


# ---- the torch side: one worker process per rank ---------------------------------------------

def torch_worker(args):
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    sys.path.insert(0, HERE)
    import torch_reference as ref

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.torch_threads)
    n_layer, n_head, n_embd, seq_len, vocab = SHAPES[args.shape]
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(SEED)
    model = ref.Gpt({"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd,
                     "seq_len": seq_len, "vocab_size": vocab})
    for module in model.modules():  # GPT-2's initialization, as zest's
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, std=0.02)
    named = model.named_for_zest()
    ddp = DistributedDataParallel(model)
    decay = [t for t in named.values() if t.dim() >= 2]
    no_decay = [t for t in named.values() if t.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    hyper = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8}
    if args.worker == "zero":
        optimizer = ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **hyper)
    else:
        optimizer = torch.optim.AdamW(groups, **hyper)
    with open(CORPUS, "rb") as f:
        tokens = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
    steps = args.warmup + args.steps
    inputs, targets = ref.token_batches(tokens, seq_len, SEED, steps, args.rows * world)
    mine = slice(rank * args.rows, (rank + 1) * args.rows)
    params = list(named.values())
    times, losses = [], []
    for step in range(steps):
        x = torch.from_numpy(inputs[step, mine])
        y = torch.from_numpy(targets[step, mine])
        begin = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = ddp(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        times.append((time.perf_counter() - begin) * 1e3)
        losses.append(float(loss))
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"step_ms": times[args.warmup:], "loss": losses}), flush=True)


def run_torch(system, shape, ranks, args):
    env = dict(os.environ, **args.extra_env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000),
               WORLD_SIZE=str(ranks), OMP_NUM_THREADS=str(args.torch_threads))
    workers = []
    for rank in range(ranks):
        command = [sys.executable, os.path.abspath(__file__), "--worker", system, "--shape", shape,
                   "--rows", str(args.rows), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--torch-threads", str(args.torch_threads)]
        workers.append(subprocess.Popen(command, env=dict(env, RANK=str(rank)),
                                        stdout=subprocess.PIPE, text=True))
    outputs, rss = [], []
    for worker in workers:
        out = worker.stdout.read()
        status, mib = wait_rss_mib(worker)
        if status != 0:
            sys.exit(f"torch {system} {shape} x{ranks}: a worker exited with {status}")
        outputs.append(out)
        rss.append(mib)
    record = json.loads(outputs[0])
    return statistics.median(record["step_ms"]), max(rss), record["loss"][-1]


# ---- the zest side ---------------------------------------------------------------------------

def run_zest(system, shape, ranks, args):
    n_layer, n_head, n_embd, seq_len, vocab = SHAPES[shape]
    stage = system.split("-s")[1]
    with tempfile.TemporaryDirectory() as scratch:
        metrics = os.path.join(scratch, "metrics.jsonl")
        sets = {"model.n_layer": n_layer, "model.n_head": n_head, "model.n_embd": n_embd,
                "model.seq_len": seq_len, "model.vocab_size": vocab, "data.val_fraction": 0,
                "world.ranks": ranks,
                "world.device_memory": '"2GiB"' if vocab > 256 else '"512MiB"',
                "train_batch_size": args.rows * ranks,
                "train_micro_batch_size_per_gpu": args.rows, "steps": args.warmup + args.steps,
                "scheduler.params.warmup_num_steps": 2, "eval_every": 0,
                "steps_per_print": 1000, "zero_optimization.stage": stage, "seed": SEED}
        program = args.baseline if system.startswith("base") else args.zest_train
        command = [program, "--config", CONFIG, "--metrics", metrics]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        env = dict(os.environ, **args.extra_env)
        if system.startswith("zest"):
            env.update(args.zest_extra_env)
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, env=env)
        status, mib = wait_rss_mib(process)
        if status != 0:
            sys.exit(f"zest {system} {shape} x{ranks}: zest-train exited with {status}")
        with open(metrics) as f:
            records = [json.loads(line) for line in f]
    steps = [r for r in records if "step" in r]
    step_ms = [r["step_ms"] for r in steps[args.warmup:]]
    return statistics.median(step_ms), mib / ranks, steps[-1]["loss"]


# ---- the driver ------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--zest-train", default=os.path.join(ROOT, "build", "bin", "zest-train"))
    parser.add_argument("--baseline", help="a second zest-train, for the base-s* systems")
    parser.add_argument("--shapes", default="small,default,mid")
    parser.add_argument("--ranks", default="1,4")
    parser.add_argument("--systems", default=",".join(SYSTEMS[:4]))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12, help="timed steps a run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--rows", type=int, default=4, help="sequences per rank a step")
    parser.add_argument("--torch-threads", type=int, default=1, help="threads per torch rank")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="set in every run's environment (e.g. OPENBLAS_CORETYPE=Haswell)")
    parser.add_argument("--zest-env", action="append", default=[], metavar="KEY=VALUE",
                        help="set in the zest-s* runs' environment only")
    parser.add_argument("--jsonl", help="also append every run as a JSON line to FILE")
    parser.add_argument("--worker", choices=["ddp", "zero"], help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=sorted(SHAPES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.extra_env = dict(item.split("=", 1) for item in args.env)
    args.zest_extra_env = dict(item.split("=", 1) for item in args.zest_env)
    if args.worker:
        return torch_worker(args)

    shapes = args.shapes.split(",")
    rank_counts = [int(r) for r in args.ranks.split(",")]
    systems = args.systems.split(",")
    for name in shapes:
        if name not in SHAPES:
            sys.exit(f"--shapes: unknown {name} (known: {', '.join(SHAPES)})")
    for name in systems:
        if name not in SYSTEMS:
            sys.exit(f"--systems: unknown {name} (known: {', '.join(SYSTEMS)})")
    if any(s.startswith("zest") for s in systems) and not os.access(args.zest_train, os.X_OK):
        sys.exit(f"--zest-train: {args.zest_train} is not an executable")
    if any(s.startswith("base") for s in systems) and not (
            args.baseline and os.access(args.baseline, os.X_OK)):
        sys.exit("--baseline: the base-s* systems need a zest-train executable")
    results = {}  # (shape, ranks, system) -> [(step_ms, rss, loss)]
    loads = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        for shape in shapes:
            for ranks in rank_counts:
                # Rotated, and reversed every other repeat: rotation alone keeps the cyclic order,
                # so the same system always ran right after torch's processes, which on a
                # shared 2-core machine cost it up to 2x (zest-s3 vs base-s3 of one binary).
                turn = repeat % len(systems)
                order = systems[turn:] + systems[:turn]
                for system in (order if repeat % 2 == 0 else order[::-1]):
                    runner = run_torch if system in ("ddp", "zero") else run_zest
                    step_ms, rss, loss = runner(system, shape, ranks, args)
                    loads.append(os.getloadavg()[0])
                    results.setdefault((shape, ranks, system), []).append((step_ms, rss, loss))
                    record = {"repeat": repeat, "shape": shape, "ranks": ranks, "system": system,
                              "step_ms": round(step_ms, 2), "rss_MiB_per_rank": round(rss, 1),
                              "last_loss": round(loss, 4), "load1": loads[-1]}
                    print(json.dumps(record), file=sys.stderr, flush=True)
                    if args.jsonl:
                        with open(args.jsonl, "a") as f:
                            f.write(json.dumps(record) + "\n")

    print(f"env {args.env}, zest-s* env {args.zest_env}, torch threads {args.torch_threads}")
    print(f"cores {os.cpu_count()}, load average (1 min) {min(loads):.1f}-{max(loads):.1f}, "
          f"medians of {args.repeats} interleaved repeats, {args.rows} sequences per rank")
    print("| shape (L×C, seq, vocab) | ranks | system | step ms | tokens/s | × ddp | "
          "RSS/rank MiB |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for shape in shapes:
        n_layer, _, n_embd, seq_len, vocab = SHAPES[shape]
        for ranks in rank_counts:
            ddp_ms = None
            if (shape, ranks, "ddp") in results:
                ddp_ms = statistics.median(r[0] for r in results[(shape, ranks, "ddp")])
            for system in systems:
                runs = results[(shape, ranks, system)]
                ms = statistics.median(r[0] for r in runs)
                rss = statistics.median(r[1] for r in runs)
                tokens = ranks * args.rows * seq_len * 1000.0 / ms
                ratio = f"{ddp_ms / ms:.2f}" if ddp_ms else "-"
                print(f"| {n_layer}×{n_embd}, {seq_len}, {vocab} | {ranks} | {system} | {ms:.1f} | "
                      f"{tokens:.0f} | {ratio} | {rss:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
