#!/bin/bash
# kill -9 zest-train at random times during async saves (a save every step, so the background
# writer is nearly always busy); every run's `latest` must resume. Run from the repository root
# after `make build`: benchmarks/async_checkpoint_kill.sh [KILLS] [SCRATCH]
bin=${ZEST_TRAIN:-build/bin/zest-train}; cfg=configs/mlp.json
n=${1:-30}; scratch=${2:-$(mktemp -d)}; lost=0
for i in $(seq 1 "$n"); do
  d=$scratch/k$i; rm -rf "$d"
  $bin --config $cfg --set world.ranks=2 --set zero_optimization.stage=3 --set steps=400 \
    --set checkpoint.dir="$d" --set checkpoint.every_steps=1 --set checkpoint.async=true \
    >/dev/null 2>&1 &
  pid=$!; sleep $((RANDOM % 2 + 1)).$((RANDOM % 10)); kill -9 $pid; wait $pid 2>/dev/null
  [ -f "$d/latest" ] || { echo "run $i: no save published yet"; continue; }
  $bin --config $cfg --set world.ranks=2 --set zero_optimization.stage=3 --set steps=1 \
    --resume "$d/$(cat "$d/latest")" >"$scratch/r$i.txt" 2>&1
  rc=$?; [ $rc -eq 0 ] || { lost=$((lost+1)); echo "run $i: resume failed rc=$rc"; }
  echo "run $i: latest $(cat "$d/latest") resume rc=$rc"
done
echo "kills=$n lost_or_corrupt=$lost"
