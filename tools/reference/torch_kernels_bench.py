#!/usr/bin/python3
"""PyTorch's CPU ops at the shapes of benchmarks/cpu_kernels_bench.cc, one thread, for the
per-kernel table: tanh GELU forward and backward over [512, 1024], LayerNorm forward and backward
over [512, 256], cross-entropy forward + backward over [512, 256] and [512, 50257], AdamW over
3.26M parameters (foreach=False and True). Median microseconds of 30 calls after 5, of the
calling thread's CPU time (time.thread_time: one thread does the work, and a shared machine's
waits do not count; Google Benchmark's cpu_time is the same measure), and GB/s counted as the
C++ benchmark counts them (each input read once, each output written once).

Not part of the build, the tests or CI: needs Debian's python3-torch.

    torch_kernels_bench.py [--threads 1]
"""

import argparse
import json
import statistics
import time


def timed(work, calls=30, warmup=5):
    for _ in range(warmup):
        work()
    samples = []
    for _ in range(calls):
        begin = time.thread_time()
        work()
        samples.append(time.thread_time() - begin)
    return statistics.median(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = []

    def report(name, seconds, bytes_moved):
        results.append({"op": name, "us": round(seconds * 1e6, 1),
                        "GB_per_s": round(bytes_moved / seconds / 1e9, 2)})

    x = torch.randn(512, 1024)
    report("gelu_forward", timed(lambda: F.gelu(x, approximate="tanh")), 2 * x.numel() * 4)
    xg = x.clone().requires_grad_()
    dy = torch.randn_like(x)

    def gelu_backward():
        y = F.gelu(xg, approximate="tanh")
        return torch.autograd.grad(y, xg, dy)
    t_both = timed(gelu_backward)
    report("gelu_backward (fwd+bwd less fwd)",
           max(t_both - timed(lambda: F.gelu(x, approximate="tanh")), 1e-9), 3 * x.numel() * 4)

    x = torch.randn(512, 256)
    w, b = torch.randn(256), torch.randn(256)
    report("layernorm_forward", timed(lambda: F.layer_norm(x, (256,), w, b, 1e-5)),
           2 * x.numel() * 4)
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, w, b))
    dy = torch.randn_like(x)

    def layernorm_both():
        y = F.layer_norm(xl, (256,), wl, bl, 1e-5)
        return torch.autograd.grad(y, (xl, wl, bl), dy)
    report("layernorm_backward (fwd+bwd less fwd)",
           max(timed(layernorm_both) - timed(lambda: F.layer_norm(x, (256,), w, b, 1e-5)), 1e-9),
           3 * x.numel() * 4)

    for classes in (256, 50257):
        logits = (torch.randn(512, classes) * 2).requires_grad_()
        targets = torch.arange(512) * 31 % classes

        def cross_entropy():
            loss = F.cross_entropy(logits, targets)
            return torch.autograd.grad(loss, logits)
        report(f"cross_entropy fwd+bwd [512, {classes}]", timed(cross_entropy, calls=10),
               2 * logits.numel() * 4)

    n = 3257856
    for foreach in (False, True):
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n) * 0.01
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.1, foreach=foreach)
        report(f"adamw (foreach={foreach})", timed(opt.step, calls=15), 7 * n * 4)

    print(json.dumps({"torch": torch.__version__, "threads": args.threads, "results": results},
                     indent=1))


if __name__ == "__main__":
    main()
