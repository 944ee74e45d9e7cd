#!/usr/bin/env python3
"""PyTorch's fused AdamW on one flat fp32 tensor of 10M..1B parameters, beside a device-to-device
copy measured in the same run: the reference for benchmarks/adamw_cuda_bench.cc, counted the same
way.

  bytes counted   AdamW reads p, g, m, v and writes p, m, v: 28 bytes a parameter. The copy
                  (dst.copy_(src), a cudaMemcpyAsync) counts what it reads and writes, 2 x its
                  size, and is sized to 28 bytes a parameter. "then_bf16" is the step followed
                  by a cast of the parameters into a bf16 tensor (PyTorch has no fused copy-out),
                  counted at 30 bytes a parameter like zest's fused row.
  GB_per_s        counted bytes / median time (10^9 bytes/s); of_copy: over the copy's GB_per_s

Times are torch.cuda.Event pairs around each step after 3 untimed steps (the first creates the
state), the median over a fixed number of steps (about 0.2 s of GPU time a row). Prints one JSON
object a line on stdout. Not part of the build or the tests; needs only torch. With
--device cpu it runs the same code on the CPU with wall-clock timing (a smoke test: small sizes,
no fused AdamW before torch 2.4).

    torch_adamw_bench.py [--sizes 10M,100M,300M,1B] [--device cuda|cpu]
"""

import argparse
import json
import statistics
import sys
import time

ADAMW_BYTES_PER_PARAM = 28
ROUNDED_BYTES_PER_PARAM = 30
WARMUP_STEPS = 3
TARGET_SECONDS = 0.2
ASSUMED_BYTES_PER_SECOND = 4e12
MIN_STEPS, MAX_STEPS = 20, 2000


def parse_count(text):
    """'10M' -> 10_000_000; 'K', 'M', 'G'/'B' are powers of 1000."""
    scale = {"K": 10**3, "M": 10**6, "G": 10**9, "B": 10**9}
    text = text.strip().upper()
    if text and text[-1] in scale:
        return int(float(text[:-1]) * scale[text[-1]])
    return int(text)


def emit(record):
    print(json.dumps(record), flush=True)


class Timer:
    """Seconds of device time for a callable: CUDA events on the current stream, else wall
    clock."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"

    def seconds(self, work):
        torch = self.torch
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            work()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3
        begin = time.perf_counter()
        work()
        return time.perf_counter() - begin

    def synchronize(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def steps_for(bytes_moved):
    steps = int(TARGET_SECONDS * ASSUMED_BYTES_PER_SECOND / bytes_moved)
    return max(MIN_STEPS, min(MAX_STEPS, steps))


def timed(timer, work, steps):
    for _ in range(WARMUP_STEPS):
        work()
    timer.synchronize()
    return statistics.median(timer.seconds(work) for _ in range(steps))


def row(bench, params, bytes_moved, seconds, **extra):
    record = {"bench": bench, "impl": "torch", "params": params,
              "bytes_per_param": bytes_moved / params, "median_ms": seconds * 1e3,
              "GB_per_s": bytes_moved / seconds / 1e9, "params_per_s": params / seconds}
    record.update(extra)
    return record


def free(torch, device):
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench_size(torch, device, params, args):
    timer = Timer(torch, device)
    copy_bytes = params * ADAMW_BYTES_PER_PARAM // 2
    source = torch.full((copy_bytes,), 0x3C, dtype=torch.uint8, device=device)
    destination = torch.empty_like(source)
    seconds = timed(timer, lambda: destination.copy_(source),
                    args.steps or steps_for(2 * copy_bytes))
    copy = row("copy", params, 2 * copy_bytes, seconds)
    emit(copy)
    del source, destination
    free(torch, device)

    p = torch.nn.Parameter(torch.full((params,), 0.0115, dtype=torch.float32, device=device))
    p.grad = torch.full_like(p, 0.0115)
    fused = device.type == "cuda" or tuple(int(x) for x in
                                           torch.__version__.split(".")[:2]) >= (2, 4)
    kwargs = {"fused": True} if fused else {}
    optimizer = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.1, **kwargs)
    seconds = timed(timer, optimizer.step, args.steps or steps_for(params * ADAMW_BYTES_PER_PARAM))
    record = row("adamw", params, params * ADAMW_BYTES_PER_PARAM, seconds, fused=fused)
    record["of_copy"] = record["GB_per_s"] / copy["GB_per_s"]
    emit(record)

    rounded = torch.empty(params, dtype=torch.bfloat16, device=device)

    def step_then_cast():
        optimizer.step()
        rounded.copy_(p.detach())

    seconds = timed(timer, step_then_cast,
                    args.steps or steps_for(params * ROUNDED_BYTES_PER_PARAM))
    record = row("adamw_then_bf16", params, params * ROUNDED_BYTES_PER_PARAM, seconds,
                 fused=fused)
    record["of_copy"] = record["GB_per_s"] / copy["GB_per_s"]
    emit(record)
    del optimizer, p, rounded
    free(torch, device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10M,100M,300M,1B",
                        help="parameter counts, comma-separated (K, M, G/B suffixes)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--steps", type=int, default=0,
                        help="timed steps a row (default: about 0.2 s of GPU time, 20..2000)")
    args = parser.parse_args()
    sizes = [parse_count(s) for s in args.sizes.split(",") if s.strip()]

    import torch  # here, so that --help works without torch
    if args.device == "cuda" and not torch.cuda.is_available():
        emit({"bench": "error", "impl": "torch", "error": "torch.cuda.is_available() is False"})
        return 1
    device = torch.device(args.device)
    context = {"bench": "context", "impl": "torch", "torch": torch.__version__,
               "device": args.device}
    if device.type == "cuda":
        context.update(gpu=torch.cuda.get_device_name(0), cuda=torch.version.cuda)
    emit(context)
    status = 0
    for params in sizes:
        try:
            bench_size(torch, device, params, args)
        except Exception as error:  # noqa: BLE001 (out of memory, no fused AdamW): next size
            emit({"bench": "error", "impl": "torch", "params": params, "error": str(error)})
            free(torch, device)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
