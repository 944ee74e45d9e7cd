#!/bin/bash
# DiLoCo against synchronous training under the link model: the default GPT on 2 modelled nodes x
# 2 ranks (threads of this process) with a slow link between the nodes, synchronous ZeRO-3 over
# the 4 ranks, then DiLoCo (2 groups, a node each, ZeRO-3 inside) at each H, one run after
# another in one go, then a markdown table: tokens/s (mean step time over steps 11..N), the bytes
# rank 0 sends across nodes per token over the whole run (the meetings are every H steps, so the
# run's sum, not one step's), the mean training loss over the last 50 steps and the last
# validation loss, each against the synchronous run's at equal tokens.
# usage: benchmarks/diloco_link.sh [BUILD_DIR] [STEPS] [HS] [GBIT] [--set KEY=VALUE ...]
#   (from the repository root) HS: the inner steps H to run, default "10 50 100"; GBIT: the
#   modelled bandwidth between nodes, default 1 (a short check:
#   `benchmarks/diloco_link.sh build 30 "10" 1 --set scheduler.params.warmup_num_steps=2`)
set -euo pipefail
build=${1:-build}
steps=${2:-1000}
hs=${3:-10 50 100}
gbit=${4:-1}
extra=("${@:5}")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {  # name, then its --set options
  local name=$1
  shift
  "$build/bin/zest-train" --config configs/default.json --set "steps=$steps" \
    --set "eval_every=$steps" --set world.ranks_per_node=2 \
    --set "world.link.bandwidth_gbit_s=$gbit" --set zero_optimization.stage=3 "$@" \
    ${extra[@]+"${extra[@]}"} --metrics "$out/$name.jsonl" > /dev/null
}
run sync
for h in $hs; do
  run "h$h" --set 'outer_loop.type="diloco"' --set "outer_loop.inner_steps=$h"
done
echo "| run | tokens/s | step ms | bytes across nodes per token (rank 0) | ÷ synchronous | train loss, last 50 steps | ÷ synchronous | val loss | ÷ synchronous |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
python3 - "$out" "$gbit" sync $(for h in $hs; do echo "h$h"; done) <<'PY'
import json, sys
folder, gbit, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def summary(name):
    records = [json.loads(l) for l in open(f"{folder}/{name}.jsonl")]
    steps = [r for r in records if "loss" in r and "step" in r]
    timed = [s for s in steps if s["step"] > 10] or steps
    ms = sum(s["step_ms"] for s in timed) / len(timed)
    tokens = steps[-1]["tokens"]  # cumulative
    across = sum(s["inter_node_bytes"] for s in steps)
    tail = steps[-50:]
    val = [r["val_loss"] for r in records if "val_loss" in r and "step" in r]
    per_step_tokens = tokens / len(steps)
    return dict(tps=per_step_tokens / ms * 1000, ms=ms, across=across / tokens,
                train=sum(s["loss"] for s in tail) / len(tail), val=val[-1] if val else float("nan"))
base = summary("sync")
for name in names:
    s = summary(name)
    label = "synchronous ZeRO-3" if name == "sync" else f"DiLoCo H = {name[1:]}"
    print(f"| {label} | {s['tps']:.0f} | {s['ms']:.1f} | {s['across']:.1f} | "
          f"{s['across'] / base['across']:.4f} | {s['train']:.4f} | {s['train'] / base['train']:.4f} | "
          f"{s['val']:.4f} | {s['val'] / base['val']:.4f} |")
PY
