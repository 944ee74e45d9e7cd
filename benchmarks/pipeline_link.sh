#!/bin/bash
# Pipeline stages against a slow data-parallel link: the default GPT (6 layers, 4 ranks as
# threads of the `local` backend) at the same global batch (train_batch_size 32) as 1 x 4 ZeRO-3
# (micro-batch 8) and as 2 pipeline stages x 2 data-parallel ranks, 1F1B, ZeRO-1, with 4 and 8
# micro-batches (micro-batch 4 and 2), with debug.collective_delay_ms 0, 2 and 10: a sleep before
# every collective, in every group, on the stream that issues it. Point-to-point sends and
# receives (the pipeline's activations and gradients) are not delayed (runtime/
# local_communicator.cc, local_point_to_point.cc), so the delay stands for a slow link between
# data-parallel ranks; the step's loss and norm all-reduce over the world (both systems) and the
# tied embedding's sum between the first and last pipeline stage (the pipeline only) are
# collectives too and are delayed as well. One run after another in one go, then a markdown
# table: tokens/s and step ms (mean over steps 11..N, the first ten left out as warm-up; all
# steps when N <= 10) and the step ms each ms of delay adds (the delayed collectives on the
# step's critical path).
# usage: benchmarks/pipeline_link.sh [BUILD_DIR] [STEPS]   (from the repository root)
set -euo pipefail
build=${1:-build-dev}
steps=${2:-30}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
systems=("1x4-zero3" "2x2-zero1-m4" "2x2-zero1-m8")
rows=()
for delay in 0 2 10; do
  for system in "${systems[@]}"; do
    case $system in
      1x4-zero3) shape=(--set zero_optimization.stage=3 --set train_micro_batch_size_per_gpu=8) ;;
      2x2-zero1-m4) shape=(--set pipeline.stages=2 --set 'pipeline.schedule="1f1b"'
                           --set zero_optimization.stage=1 --set train_micro_batch_size_per_gpu=4) ;;
      2x2-zero1-m8) shape=(--set pipeline.stages=2 --set 'pipeline.schedule="1f1b"'
                           --set zero_optimization.stage=1 --set train_micro_batch_size_per_gpu=2) ;;
    esac
    "$build/bin/zest-train" --config configs/default.json --set "steps=$steps" --set eval_every=0 \
      --set "scheduler={}" \
      --set train_batch_size=32 --set world.ranks=4 --set "debug.collective_delay_ms=$delay" \
      "${shape[@]}" --metrics "$out/$delay-$system.jsonl" > /dev/null
    rows+=("$delay $system $out/$delay-$system.jsonl")
  done
done
python3 - "$out" "${rows[@]}" <<'PY'
import json, sys
out, rows = sys.argv[1], [r.split() for r in sys.argv[2:]]
names = {"1x4-zero3": "1 x 4, ZeRO-3, micro-batch 8",
         "2x2-zero1-m4": "2 x 2 pipeline (1F1B, 4 micro-batches of 4) + ZeRO-1",
         "2x2-zero1-m8": "2 x 2 pipeline (1F1B, 8 micro-batches of 2) + ZeRO-1"}
def mean_ms(path):
    steps = [json.loads(l) for l in open(path) if '"loss"' in l]
    timed = [s for s in steps if s["step"] > 10] or steps
    return sum(s["step_ms"] for s in timed) / len(timed), steps[0]["tokens"]
base = {system: mean_ms(path)[0] for delay, system, path in rows if delay == "0"}
print("| delay ms per collective | system | tokens/s | step ms | step ms added per ms of delay |")
print("| ---: | --- | ---: | ---: | ---: |")
for delay, system, path in rows:
    ms, tokens = mean_ms(path)
    added = "" if delay == "0" else f"{(ms - base[system]) / float(delay):.1f}"
    print(f"| {delay} | {names[system]} | {tokens / ms * 1000:.0f} | {ms:.1f} | {added} |")
PY
