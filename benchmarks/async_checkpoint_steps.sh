#!/bin/bash
# The step time of steps that overlap an asynchronous save, beside steps with no save and steps
# after a synchronous save, in one run of this script (issue #39's must-show: overlapping step
# <= 1.1 x plain step). Three runs per shape, a save every step where there is one:
#   none   no checkpoint.dir
#   async  checkpoint.async true: step_ms runs while the background writer writes the previous
#          step's save; the loop's stall is checkpoint_wait_s (snapshot + wait for the writer)
#   sync   checkpoint.async false: checkpoint_wait_s is the whole save
# Shapes: the default GPT (configs/default.json) and GPT-2 small's (12 x 12 x 768, seq 128).
# The first step of each run (start-up) is left out. Run from the repository root after
# `make build`: benchmarks/async_checkpoint_steps.sh [STEPS_DEFAULT] [STEPS_GPT2] [SCRATCH]
set -euo pipefail
bin=${ZEST_TRAIN:-build/bin/zest-train}
steps_default=${1:-20}; steps_gpt2=${2:-4}; scratch=${3:-$(mktemp -d)}

# run NAME MODE STEPS [--set ...]: trains into $scratch/NAME, metrics in $scratch/NAME.jsonl
run() {
  local name=$1 mode=$2 steps=$3; shift 3
  local save=()
  case $mode in
    async) save=(--set checkpoint.dir="$scratch/$name" --set checkpoint.every_steps=1
                 --set checkpoint.keep_last=2 --set checkpoint.async=true) ;;
    sync)  save=(--set checkpoint.dir="$scratch/$name" --set checkpoint.every_steps=1
                 --set checkpoint.keep_last=2 --set checkpoint.async=false) ;;
  esac
  rm -rf "${scratch:?}/$name"
  "$bin" --config configs/default.json --set steps="$steps" --set eval_every=0 \
    --set scheduler.params.warmup_num_steps=1 \
    --set steps_per_print=1000 "${save[@]}" "$@" --metrics "$scratch/$name.jsonl" >/dev/null
}

# summarize NAME: mean step_ms and mean checkpoint_wait_s over steps 2..N
summarize() {
  python3 - "$scratch/$1.jsonl" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in steps if "loss" in r and r["step"] >= 2]
ms = sum(r["step_ms"] for r in steps) / len(steps)
wait = sum(r.get("checkpoint_wait_s", 0.0) for r in steps) / len(steps) * 1e3
print(f"{ms:.1f} {wait:.1f}")
EOF
}

echo "| shape | steps | plain step ms | async: step ms | async: loop wait ms | sync: step ms | sync: loop wait ms | async step / plain |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
shape() {
  local label=$1 steps=$2; shift 2
  run "$label-none" none "$steps" "$@"
  run "$label-async" async "$steps" "$@"
  run "$label-sync" sync "$steps" "$@"
  read -r plain _ < <(summarize "$label-none")
  read -r async_ms async_wait < <(summarize "$label-async")
  read -r sync_ms sync_wait < <(summarize "$label-sync")
  ratio=$(python3 -c "print(f'{$async_ms / $plain:.2f}')")
  echo "| $label | $steps | $plain | $async_ms | $async_wait | $sync_ms | $sync_wait | $ratio |"
}
shape default "$steps_default"
shape gpt2-small "$steps_gpt2" --set model.n_layer=12 --set model.n_head=12 \
  --set model.n_embd=768 --set model.seq_len=128 --set world.device_memory=4GiB
