#!/bin/bash
# ZeRO-3, hybrid sharding and ZeRO++ under the link model: the default GPT on 2 modelled nodes x
# 2 ranks (threads of this process), at each link bandwidth, one run after another in one go, then
# a markdown table of tokens/s (mean step time over steps 11..N, the first ten left out as
# warm-up; all steps when there are fewer) and rank 0's bytes per step inside and across nodes
# (its metrics records; every rank sends the same, so the world's traffic is 4 times it).
# Setups: ZeRO-3; hybrid (shard in the node); ZeRO++ (ZeRO-3 + qwZ + hpZ of a node + qgZ);
# hybrid + qwZ + qgZ (hpZ is redundant with hybrid sharding: its gathers stay in the node).
# usage: benchmarks/hybrid_link.sh [BUILD_DIR] [STEPS] [LINKS] [--set KEY=VALUE ...]
#   (from the repository root) LINKS: the bandwidths, Gbit/s or "off" (not modelled), default
#   "off 10 100"; the --set overrides go to every run (a short check:
#   `benchmarks/hybrid_link.sh build-dev 3 "off 10 100" --set scheduler.params.warmup_num_steps=1`)
set -euo pipefail
build=${1:-build-dev}
steps=${2:-30}
links=${3:-off 10 100}
extra=("${@:4}")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
declare -A setup=(
  [zero3]='--set zero_optimization.hybrid_shard_size="off"'
  [hybrid]='--set zero_optimization.hybrid_shard_size="node"'
  [zeropp]='--set zero_optimization.hybrid_shard_size="off" --set zero_optimization.zero_hpz_partition_size=2 --set zero_optimization.zero_quantized_weights=true --set zero_optimization.zero_quantized_gradients=true'
  [hybridq]='--set zero_optimization.hybrid_shard_size="node" --set zero_optimization.zero_quantized_weights=true --set zero_optimization.zero_quantized_gradients=true'
)
rows=()
for gbit in $links; do
  for mode in zero3 hybrid zeropp hybridq; do
    link=(--set "world.link.model=\"off\"")
    [ "$gbit" != off ] && link=(--set "world.link.bandwidth_gbit_s=$gbit")
    read -r -a options <<< "${setup[$mode]}"
    "$build/bin/zest-train" --config configs/default.json --set "steps=$steps" --set eval_every=0 \
      --set world.ranks_per_node=2 "${options[@]}" "${link[@]}" ${extra[@]+"${extra[@]}"} \
      --metrics "$out/$gbit-$mode.jsonl" > /dev/null
    rows+=("$gbit $mode $out/$gbit-$mode.jsonl")
  done
done
echo "| link | setup | tokens/s | step ms | MiB/step inside node (rank 0) | MiB/step across nodes (rank 0) | across, all ranks |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
for row in "${rows[@]}"; do
  set -- $row
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
gbit, mode, path = sys.argv[1:]
steps = [json.loads(l) for l in open(path) if '"loss"' in l]
timed = [s for s in steps if s["step"] > 10] or steps
ms = sum(s["step_ms"] for s in timed) / len(timed)
tokens = steps[0]["tokens"]  # tokens per step
mib = lambda b: b / 2**20
last = steps[-1]
link = "none (not modelled)" if gbit == "off" else f"{gbit} Gbit/s, 10 us"
name = {"zero3": "ZeRO-3", "hybrid": "hybrid (shard in node)",
        "zeropp": "ZeRO++ (ZeRO-3 + qwZ + hpZ 2 + qgZ)",
        "hybridq": "hybrid + qwZ + qgZ"}[mode]
print(f"| {link} | {name} | {tokens / ms * 1000:.0f} | {ms:.1f} | {mib(last['intra_node_bytes']):.2f} | "
      f"{mib(last['inter_node_bytes']):.2f} | {mib(4 * last['inter_node_bytes']):.2f} |")
PY
done
