#!/bin/bash
# 3D layouts under the link model: the default GPT with 8 heads (so that 4 tensor-parallel ranks
# divide them; 6 layers, 192 channels, seq 64, vocabulary 256, fp32, ZeRO-1) at one global batch
# (train_batch_size 32, micro-batch 4) as each (p, t, d) layout — pipeline stages x
# tensor-parallel ranks x data-parallel ranks — of 4 and of 8 ranks (threads of this process), on
# 2 modelled nodes (world.ranks_per_node = ranks / 2) joined by a link of LINK Gbit/s. One run
# after another in one go, then a markdown table: tokens/s (mean step time over steps 6..N, the
# first five left out as warm-up; all steps when there are fewer) and rank 0's bytes per step on
# each axis of the mesh (its metrics' `axis_bytes`: the data-parallel, tensor-parallel and
# pipeline groups' traffic) and across nodes. Rank 0 is pipeline stage 0, tensor rank 0,
# data-parallel rank 0: the other ranks of its pipeline stage send alike; a later pipeline stage
# sends activations' gradients back instead of activations forward.
# usage: benchmarks/mesh_layouts.sh [BUILD_DIR] [STEPS] [LINK] [--set KEY=VALUE ...]
#   (from the repository root; LINK default 25; a short check: `benchmarks/mesh_layouts.sh build 3`)
set -euo pipefail
build=${1:-build}
steps=${2:-20}
link=${3:-25}
extra=("${@:4}")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
layouts=("1 1 4" "1 2 2" "1 4 1" "2 1 2" "2 2 1" "4 1 1"
         "1 1 8" "1 2 4" "1 4 2" "2 1 4" "2 2 2" "2 4 1" "4 2 1")
rows=()
for layout in "${layouts[@]}"; do
  read -r p t d <<< "$layout"
  ranks=$((p * t * d))
  options=(--set "world.ranks=$ranks" --set "world.ranks_per_node=$((ranks / 2))")
  [ "$t" -gt 1 ] && options+=(--set "tensor_parallel={\"size\": $t}")
  [ "$p" -gt 1 ] && options+=(--set "pipeline={\"stages\": $p}")
  "$build/bin/zest-train" --config configs/default.json --set "steps=$steps" --set eval_every=0 \
    --set "scheduler={}" --set model.n_head=8 --set train_batch_size=32 \
    --set train_micro_batch_size_per_gpu=4 --set zero_optimization.stage=1 \
    --set "world.link.bandwidth_gbit_s=$link" "${options[@]}" ${extra[@]+"${extra[@]}"} \
    --metrics "$out/$p-$t-$d.jsonl" > /dev/null
  rows+=("$p $t $d $out/$p-$t-$d.jsonl")
done
python3 - "$link" "${rows[@]}" <<'PY'
import json, sys
link, rows = sys.argv[1], [r.split() for r in sys.argv[2:]]
print(f"| ranks | p x t x d | tokens/s | step ms | data MiB/step | tensor MiB/step | "
      f"pipeline MiB/step | across nodes MiB/step |")
print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for p, t, d, path in rows:
    steps = [json.loads(l) for l in open(path) if '"loss"' in l]
    timed = [s for s in steps if s["step"] > 5] or steps
    ms = sum(s["step_ms"] for s in timed) / len(timed)
    tokens = steps[0]["tokens"]
    mib = lambda key: sum(s.get("axis_bytes", {}).get(key, 0) for s in timed) / len(timed) / 2**20
    across = sum(s["inter_node_bytes"] for s in timed) / len(timed) / 2**20
    ranks = int(p) * int(t) * int(d)
    print(f"| {ranks} | {p} x {t} x {d} | {tokens / ms * 1000:.0f} | {ms:.1f} | {mib('data'):.2f} | "
          f"{mib('tensor'):.2f} | {mib('pipeline'):.2f} | {across:.2f} |")
PY
