#!/usr/bin/env bash
# Writes zest-estimate's output (plain and --json) for every configs/*.json and for --set variants
# that reach recomputation, hpZ, qgZ across replicas, pipeline stages, the CUDA device and tensor
# parallelism, one file per case, into OUT. Run it with two builds' binaries and `diff -r` the two
# folders: the memory planner's numbers must not move when its implementation does.
# Usage: tools/planner-check/estimate-outputs.sh ZEST_ESTIMATE OUT
set -euo pipefail
estimate=$1
out=$2
mkdir -p "$out"
cd "$(dirname "$0")/../.."

run() {  # name, then zest-estimate's arguments
  local name=$1
  shift
  "$estimate" "$@" > "$out/$name.txt" 2>&1 || echo "exit $?" >> "$out/$name.txt"
  "$estimate" --json "$@" > "$out/$name.json" 2>&1 || echo "exit $?" >> "$out/$name.json"
}

for config in configs/*.json; do
  run "$(basename "$config" .json)" --config "$config"
done
s3=configs/gpt_stage3.json
run recompute-full --config $s3 --set 'activation_checkpointing={"policy":"full"}'
run recompute-selective --config $s3 --set 'activation_checkpointing={"policy":"selective"}'
run recompute-cpu --config $s3 \
  --set 'activation_checkpointing={"policy":"full","units":{"every":2},"cpu_checkpointing":true}'
run hpz --config $s3 --set zero_optimization.zero_hpz_partition_size=2
run hpz-qwz --config $s3 --set zero_optimization.zero_hpz_partition_size=4 \
  --set zero_optimization.zero_quantized_weights=true
run qgz --config $s3 --set zero_optimization.zero_quantized_gradients=true
run qgz-replicas --config $s3 --set zero_optimization.zero_quantized_gradients=true \
  --set zero_optimization.hybrid_shard_size=2
run qgz-replicas-s2 --config configs/gpt_stage2.json --set zero_optimization.zero_quantized_gradients=true \
  --set zero_optimization.hybrid_shard_size=2 --set zero_optimization.zero_quantized_gradients_bits=4
run pipeline-1f1b --config $s3 --set 'pipeline={"stages":2}'
run pipeline-gpipe --config configs/gpt_stage1.json --set 'pipeline={"stages":2,"schedule":"gpipe"}'
run pipeline-interleaved --config configs/gpt_stage2.json \
  --set 'pipeline={"stages":2,"schedule":"interleaved_1f1b"}'
run pipeline-zb --config configs/gpt_stage0.json --set 'pipeline={"stages":4,"schedule":"zb_h1"}'
run pipeline-recompute --config $s3 --set 'pipeline={"stages":2}' \
  --set 'activation_checkpointing={"policy":"full"}'
run pipeline-cuda --config configs/gpt2_cuda.json --set world.ranks=4 --set 'pipeline={"stages":2}'
run cuda-s3 --config configs/gpt2_cuda.json --set zero_optimization.stage=3 --set world.ranks=8
run cuda-recompute --config configs/gpt2_cuda.json \
  --set 'activation_checkpointing={"policy":"selective"}'
run cuda-hpz --config configs/gpt2_cuda.json --set zero_optimization.stage=3 --set world.ranks=8 \
  --set zero_optimization.zero_hpz_partition_size=4
run cuda-qgz-replicas --config configs/gpt2_cuda.json --set world.ranks=8 \
  --set zero_optimization.zero_quantized_gradients=true --set zero_optimization.hybrid_shard_size=4
run cuda-offload --config configs/gpt2_cuda.json --set world.ranks=8 \
  --set zero_optimization.offload_optimizer.device='"cpu"'
run tp2 --config configs/default.json --set 'tensor_parallel={"size":2}'
run tp2-sp-s1 --config configs/gpt_stage1.json --set 'tensor_parallel={"size":2,"sequence_parallel":true}'
run tp4-sp --config configs/default.json --set model.n_head=8 \
  --set 'tensor_parallel={"size":4,"sequence_parallel":true}'
