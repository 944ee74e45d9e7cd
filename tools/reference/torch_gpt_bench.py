#!/usr/bin/env python3
"""Training throughput of GPT-2 in plain PyTorch, the reference for benchmarks/gpt_cuda_bench.cc:
the same model (pre-LN blocks, causal multi-head attention, tanh GELU, LM head tied to wte), the
same shapes and batch, bf16 autocast over fp32 parameters, torch.optim.AdamW(fused=True), lr
1e-4, weight decay 0.1, no clipping, random tokens; eager or torch.compile. In the same run, the
bf16 GEMM rate on a large square problem (torch.matmul, random data), the ceiling MFU is taken
against, as zest's benchmark does with cuBLASLt.

  step_ms        median time of zero_grad + forward + backward + step (CUDA events, synchronized
                 each step), after --warmup untimed steps (torch.compile compiles in the first)
  tokens_per_s   B·T / step_ms
  model_TFLOPs   (6·N·B·T + 12·L·C·T·B·T) / step time, N the parameters less wpe: zest's
                 formula (attention counted over the full T×T even where SDPA skips the masked
                 half), so the two compare as times do
  mfu            model_TFLOPs / gemm_TFLOPs
  peak_*_MiB     torch.cuda.max_memory_allocated / reserved over the training steps, and the
                 parameters, gradients and optimizer state as tensors; other_at_peak is the
                 allocated peak less those three (activations, autocast's bf16 weight copies and
                 workspace)

--attention sdpa uses F.scaled_dot_product_attention (flash, as a PyTorch user would);
--attention naive computes softmax(QKᵀ/√d + causal mask)·V explicitly, as zest does. Prints one
JSON object a line on stdout. Not part of the build or the tests. --device cpu with --model tiny
is a smoke test of the code (wall-clock timing, no fused AdamW before torch 2.4).

    torch_gpt_bench.py [--model gpt2-small|gpt2-6L|tiny] [--mode eager|compile]
                       [--attention sdpa|naive] [--batch 8] [--steps 10] [--device cuda|cpu]
"""

import argparse
import json
import math
import statistics
import sys
import time

MODELS = {  # n_layer, n_head, n_embd, vocab_size, seq_len, batch: as gpt_cuda_bench.cc
    "gpt2-small": (12, 12, 768, 50257, 1024, 8),
    "gpt2-6L": (6, 6, 384, 50257, 512, 8),
    "tiny": (2, 2, 64, 256, 32, 2),  # smoke tests only
}
GEMM_SIZE = 8192
GEMM_STEPS = 30


def emit(record):
    print(json.dumps(record), flush=True)


def build_model(torch, n_layer, n_head, n_embd, vocab_size, seq_len, attention):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        """x + attn(ln_1(x)), then + mlp(ln_2(x))."""

        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.attn_proj = nn.Linear(n_embd, n_embd)
            self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.mlp_proj = nn.Linear(4 * n_embd, n_embd)
            self.register_buffer("causal", torch.ones(seq_len, seq_len, dtype=torch.bool).tril(),
                                 persistent=False)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            if attention == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // n_head))
                scores = scores.masked_fill(~self.causal[:T, :T], float("-inf"))
                y = F.softmax(scores, dim=-1) @ v
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        """Token + position embeddings, the blocks, ln_f, logits = ln_f(x)·wteᵀ (tied)."""

        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab_size, n_embd)
            self.wpe = nn.Embedding(seq_len, n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
            for module in self.modules():  # GPT-2's initialization
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                if isinstance(module, nn.Linear):
                    nn.init.zeros_(module.bias)

        def forward(self, tokens, targets):
            T = tokens.shape[1]
            positions = torch.arange(T, device=tokens.device)
            x = self.wte(tokens) + self.wpe(positions)
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.view(-1))

    return Gpt()


class Timer:
    """Seconds a callable takes, synchronized: CUDA events on CUDA, else wall clock."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"

    def seconds(self, work):
        torch = self.torch
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            result = work()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3, result
        begin = time.perf_counter()
        result = work()
        return time.perf_counter() - begin, result


def gemm_rate(torch, device, timer, size):
    """FLOP/s of a bf16 size³ matrix product on random data, median of GEMM_STEPS."""
    a = torch.rand(size, size, device=device).mul_(2).sub_(1).to(torch.bfloat16)
    b = torch.rand(size, size, device=device).mul_(2).sub_(1).to(torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b.t())
    seconds = statistics.median(timer.seconds(lambda: torch.matmul(a, b.t()))[0]
                                for _ in range(GEMM_STEPS))
    return 2.0 * size**3 / seconds


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-small", choices=sorted(MODELS))
    parser.add_argument("--mode", default="eager", choices=["eager", "compile"])
    parser.add_argument("--attention", default="sdpa", choices=["sdpa", "naive"])
    parser.add_argument("--batch", type=int, default=0, help="rows a step (default: the model's)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--gemm-size", type=int, default=GEMM_SIZE,
                        help="n of the n×n×n bf16 ceiling product (0: skip it)")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1")

    import torch  # here, so that --help works without torch
    n_layer, n_head, n_embd, vocab_size, seq_len, batch = MODELS[args.model]
    batch = args.batch or batch
    base = {"bench": "gpt", "impl": "torch", "model": args.model, "mode": args.mode,
            "attention": args.attention, "batch": batch, "seq": seq_len, "torch": torch.__version__}
    if args.device == "cuda" and not torch.cuda.is_available():
        emit(dict(base, error="torch.cuda.is_available() is False"))
        return 1
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        base["gpu"] = torch.cuda.get_device_name(0)
    timer = Timer(torch, device)

    try:
        gemm = gemm_rate(torch, device, timer, args.gemm_size) if args.gemm_size > 0 else 0.0
        if cuda:
            torch.cuda.empty_cache()  # the ceiling's operands stay out of the memory peaks
        torch.manual_seed(1234)
        model = build_model(torch, n_layer, n_head, n_embd, vocab_size, seq_len,
                            args.attention).to(device)
        parameters = sum(p.numel() for p in model.parameters())  # the tied wte once
        version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        fused = cuda or version >= (2, 4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1,
                                      **({"fused": True} if fused else {}))
        step_model = torch.compile(model) if args.mode == "compile" else model
        generator = torch.Generator().manual_seed(1)
        stream = torch.randint(0, vocab_size, (batch * seq_len + 1,), generator=generator)
        inputs = stream[:-1].view(batch, seq_len).to(device)
        targets = stream[1:].view(batch, seq_len).to(device)

        def step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                loss = step_model(inputs, targets)
            loss.backward()
            optimizer.step()
            return loss

        if cuda:
            torch.cuda.reset_peak_memory_stats()
        begin = time.perf_counter()
        first_seconds, _ = timer.seconds(step)  # compiles, with torch.compile
        for _ in range(args.warmup - 1):
            timer.seconds(step)
        warmup_seconds = time.perf_counter() - begin
        times = []
        for _ in range(args.steps):
            seconds, loss = timer.seconds(step)
            times.append(seconds)
        step_seconds = statistics.median(times)
    except Exception as error:  # noqa: BLE001 (out of memory, compile failures): one line
        emit(dict(base, error=f"{type(error).__name__}: {error}"))
        return 1

    tokens = batch * seq_len
    flops = (6.0 * (parameters - seq_len * n_embd) + 12.0 * n_layer * n_embd * seq_len) * tokens
    mib = float(1 << 20)
    record = dict(base, parameters=parameters, fused_adamw=fused, step_ms=step_seconds * 1e3,
                  tokens_per_s=tokens / step_seconds, model_TFLOPs=flops / step_seconds / 1e12,
                  step_TFLOP=flops / 1e12, first_step_s=first_seconds, warmup_s=warmup_seconds,
                  loss=float(loss))
    if gemm > 0:
        record.update(gemm_TFLOPs=gemm / 1e12, mfu=flops / step_seconds / gemm)
    params_bytes = tensor_bytes(model.parameters())
    grads_bytes = tensor_bytes(p.grad for p in model.parameters() if p.grad is not None)
    optimizer_bytes = tensor_bytes(t for state in optimizer.state.values()
                                   for t in state.values() if torch.is_tensor(t))
    record.update(peak_params_MiB=params_bytes / mib, peak_grads_MiB=grads_bytes / mib,
                  peak_optimizer_MiB=optimizer_bytes / mib)
    if cuda:
        allocated = torch.cuda.max_memory_allocated()
        record.update(peak_total_MiB=allocated / mib,
                      peak_reserved_MiB=torch.cuda.max_memory_reserved() / mib,
                      other_at_peak_MiB=(allocated - params_bytes - grads_bytes
                                         - optimizer_bytes) / mib)
    emit(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
