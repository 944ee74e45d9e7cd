#!/usr/bin/python3
"""An independent PyTorch implementation of zest's built-in models and training step, used to
make the parity fixtures under tests/fixtures/ (see tests/fixtures/README.md).

It reads a zest-train config (config.json) for the model and the hyperparameters, starts from
the parameters zest exported (`zest-train --export-initial init.safetensors`), trains with
torch.optim.AdamW, DeepSpeed's LR schedule and torch.nn.utils.clip_grad_norm_ in fp32 on the
CPU, and writes expected.json (per-step loss, gradient norm, lr), final.safetensors (the
parameters after the last step) and batches.safetensors (the exact batch of every step).

Not part of the build, the tests or CI: it needs Debian's python3-torch and python3-numpy and
runs with /usr/bin/python3. Nothing here imports zest; the safetensors and llm.c token-shard
formats are read and written by a few lines below.

    torch_reference.py gpt-tokens DIR   write DIR/tokens.bin (needs DIR/config.json)
    torch_reference.py gpt DIR          train the GPT of DIR/config.json from DIR/init.safetensors
    torch_reference.py mlp DIR          the same for an MLP, on batches drawn here
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- file formats --------------------------------------------------------------------------

SAFETENSORS_DTYPES = {"F32": np.float32, "I32": np.int32, "F64": np.float64}
SAFETENSORS_NAMES = {np.dtype(v): k for k, v in SAFETENSORS_DTYPES.items()}


def read_safetensors(path):
    """{name: numpy array} from a safetensors file (8-byte LE header length, JSON, raw LE data)."""
    with open(path, "rb") as f:
        blob = f.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length].decode("utf-8"))
    data = blob[8 + length:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        dtype = np.dtype(SAFETENSORS_DTYPES[entry["dtype"]]).newbyteorder("<")
        array = np.frombuffer(data[begin:end], dtype=dtype).reshape(entry["shape"])
        tensors[name] = array.astype(dtype.newbyteorder("="))
    return tensors


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: numpy array} in the given order; the header is padded with spaces to a
    multiple of 8 bytes, as zest's strict reader requires."""
    header = {}
    chunks = []
    offset = 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": SAFETENSORS_NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in chunks:
            f.write(raw)
    os.replace(path + ".tmp", path)


TOKEN_SHARD_MAGIC = 20240520


def write_token_shard(path, tokens):
    """llm.c's .bin shard: 256 int32 (magic, version 1, token count, zeros), then uint16 tokens."""
    header = np.zeros(256, dtype="<i4")
    header[0], header[1], header[2] = TOKEN_SHARD_MAGIC, 1, len(tokens)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype="<u2").tobytes())
    os.replace(path + ".tmp", path)


def read_token_shard(path):
    with open(path, "rb") as f:
        blob = f.read()
    header = np.frombuffer(blob[:1024], dtype="<i4")
    if header[0] != TOKEN_SHARD_MAGIC or header[1] != 1:
        sys.exit(f"{path}: not an llm.c token shard")
    tokens = np.frombuffer(blob[1024:], dtype="<u2").astype(np.int64)
    if len(tokens) != header[2]:
        sys.exit(f"{path}: header says {header[2]} tokens, file has {len(tokens)}")
    return tokens


# ---- zest-train's data order (data/token_batches.cc), reimplemented --------------------------

MASK64 = (1 << 64) - 1


def mix(x):
    """SplitMix64's finalizer, as zest's TokenBatches uses it."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def window_of(sequence, windows, seed):
    """The window (of seq_len + 1 tokens, starting at window * seq_len) that sequence `sequence`
    of the run reads: an affine permutation of the windows per epoch, drawn from the seed."""
    epoch, position = divmod(sequence, windows)
    if windows == 1:
        return position
    draw = mix((seed ^ mix(epoch)) & MASK64)
    multiplier = 1 + draw % windows
    while math.gcd(multiplier, windows) != 1:
        multiplier += 1
    offset = mix(draw) % windows
    return (multiplier * position + offset) % windows


def token_batches(tokens, seq_len, seed, steps, rows):
    """inputs, targets [steps, rows, seq_len]: step s (1-based) is global batch s - 1."""
    windows = (len(tokens) - 1) // seq_len
    inputs = np.zeros((steps, rows, seq_len), dtype=np.int32)
    targets = np.zeros_like(inputs)
    for step in range(steps):
        for row in range(rows):
            start = window_of(step * rows + row, windows, seed) * seq_len
            inputs[step, row] = tokens[start:start + seq_len]
            targets[step, row] = tokens[start + 1:start + seq_len + 1]
    return inputs, targets


# ---- DeepSpeed's LR schedules (deepspeed/runtime/lr_schedules.py), reimplemented ---------------

def schedule_lr(config, step):
    """The rate of optimizer step `step` (1-based): DeepSpeed's get_lr() at
    last_batch_iteration = step - 1 (as zest's optim/lr_schedule.h documents)."""
    base = config["optimizer"]["params"]["lr"]
    scheduler = config.get("scheduler")
    if not scheduler:
        return base
    kind = scheduler["type"]
    p = scheduler.get("params", {})
    warmup = max(2, p.get("warmup_num_steps", 1000))
    warmup_type = p.get("warmup_type", "log")
    total = p.get("total_num_steps", config["steps"])
    it = step - 1

    def gamma():
        if warmup_type == "log":
            return (1.0 / math.log(warmup)) * math.log(it + 1)
        return it / warmup

    if kind == "WarmupCosineLR":
        if it < warmup:
            lo = p.get("warmup_min_ratio", 0.0)
            ratio = lo + gamma() * (1.0 - lo)
        else:
            cos_min = p.get("cos_min_ratio", 0.0001)
            done, span = it - warmup + 1, total - warmup
            ratio = max(0.0, cos_min + (1.0 - cos_min) * (1 + math.cos(math.pi * done / span)) / 2)
        return base * ratio
    min_lr = p.get("warmup_min_lr", 0.0)
    max_lr = p.get("warmup_max_lr", base)
    if it < warmup:
        g = gamma()
    elif kind == "WarmupDecayLR":
        g = max(0.0, (total - it) / (total - warmup))
    elif kind == "WarmupLR":
        g = 1.0
    else:
        sys.exit(f"scheduler.type {kind} is not implemented here")
    return min_lr + (max_lr - min_lr) * g


# ---- the models ------------------------------------------------------------------------------

class Block(nn.Module):
    """GPT-2's pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.attn_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hd).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    def named_for_zest(self, prefix):
        return {f"{prefix}.ln_1.weight": self.ln_1.weight, f"{prefix}.ln_1.bias": self.ln_1.bias,
                f"{prefix}.attn.c_attn.weight": self.c_attn.weight,
                f"{prefix}.attn.c_attn.bias": self.c_attn.bias,
                f"{prefix}.attn.c_proj.weight": self.attn_proj.weight,
                f"{prefix}.attn.c_proj.bias": self.attn_proj.bias,
                f"{prefix}.ln_2.weight": self.ln_2.weight, f"{prefix}.ln_2.bias": self.ln_2.bias,
                f"{prefix}.mlp.c_fc.weight": self.c_fc.weight,
                f"{prefix}.mlp.c_fc.bias": self.c_fc.bias,
                f"{prefix}.mlp.c_proj.weight": self.mlp_proj.weight,
                f"{prefix}.mlp.c_proj.bias": self.mlp_proj.bias}


class Gpt(nn.Module):
    """GPT-2: token + position embeddings, pre-LN blocks, ln_f, LM head tied to wte."""

    def __init__(self, m):
        super().__init__()
        self.wte = nn.Embedding(m["vocab_size"], m["n_embd"])
        self.wpe = nn.Embedding(m["seq_len"], m["n_embd"])
        self.blocks = nn.ModuleList(Block(m["n_embd"], m["n_head"]) for _ in range(m["n_layer"]))
        self.ln_f = nn.LayerNorm(m["n_embd"], eps=1e-5)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1).long())

    def named_for_zest(self):
        named = {"embedding.wte": self.wte.weight, "embedding.wpe": self.wpe.weight}
        for i, block in enumerate(self.blocks):
            named.update(block.named_for_zest(f"block{i}"))
        named.update({"head.ln_f.weight": self.ln_f.weight, "head.ln_f.bias": self.ln_f.bias})
        return named


class Mlp(nn.Module):
    """Linear layers with tanh-GELU between them; cross-entropy on the last one's logits."""

    def __init__(self, sizes):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))

    def forward(self, x, targets):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.gelu(x, approximate="tanh")
        return F.cross_entropy(x, targets.long())

    def named_for_zest(self):
        named = {}
        for i, layer in enumerate(self.layers):
            named[f"layer{i}.weight"] = layer.weight
            named[f"layer{i}.bias"] = layer.bias
        return named


# ---- training --------------------------------------------------------------------------------

def load_initial(named, path):
    init = read_safetensors(path)
    if set(init) != set(named):
        sys.exit(f"{path}: tensors {sorted(set(init) ^ set(named))} do not match the model")
    with torch.no_grad():
        for name, param in named.items():
            if tuple(init[name].shape) != tuple(param.shape):
                sys.exit(f"{path}: {name} is {init[name].shape}, the model's is {param.shape}")
            param.copy_(torch.from_numpy(init[name]))


def train(config, model, named, batches, fixture, extra_metadata):
    """Trains on batches [(inputs, targets)] and writes the fixture's expected.json and
    final.safetensors."""
    for key in ("bf16", "fp16"):
        if config.get(key, {}).get("enabled", False):
            sys.exit(f"{key}: the reference trains in fp32 only")
    if config.get("gradient_accumulation_steps", 1) != 1:
        sys.exit("gradient_accumulation_steps: the reference takes one batch per step")
    opt = config["optimizer"]
    if opt["type"] != "AdamW":
        sys.exit("optimizer.type: the reference implements AdamW only")
    p = opt["params"]
    # As zest (ParamSpec::weight_decay): every matrix decays (the embeddings too, as in llm.c
    # and nanoGPT), biases and LayerNorm parameters do not.
    decay = [t for t in named.values() if t.dim() >= 2]
    no_decay = [t for t in named.values() if t.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": p.get("weight_decay", 0.0)},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=p["lr"], betas=tuple(p.get("betas", (0.9, 0.999))), eps=p.get("eps", 1e-8),
        foreach=False)
    clip = config.get("gradient_clipping", 0.0)
    params = list(named.values())
    losses, norms, lrs = [], [], []
    for step, (inputs, targets) in enumerate(batches, start=1):
        lr = schedule_lr(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        loss = model(torch.from_numpy(inputs), torch.from_numpy(targets))
        loss.backward()
        # The norm before clipping, as zest's StepStats::grad_norm; with clip 0 only measured.
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        optimizer.step()
        losses.append(float(loss))
        norms.append(float(norm))
        lrs.append(float(np.float32(lr)))
        print(f"step {step:3d}  loss {losses[-1]:.6f}  grad_norm {norms[-1]:.6f}  lr {lr:.3e}")
    expected = {"torch_version": torch.__version__, "numpy_version": np.__version__,
                "steps": len(losses), "loss": losses, "grad_norm": norms, "lr": lrs}
    expected.update(extra_metadata)
    with open(os.path.join(fixture, "expected.json.tmp"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    os.replace(os.path.join(fixture, "expected.json.tmp"), os.path.join(fixture, "expected.json"))
    final = {name: t.detach().numpy().astype(np.float32) for name, t in named.items()}
    write_safetensors(os.path.join(fixture, "final.safetensors"), final,
                      {"torch_version": torch.__version__})


def read_config(fixture):
    with open(os.path.join(fixture, "config.json")) as f:
        return json.load(f)


def gpt_tokens(fixture):
    """A token stream with structure to learn: a fixed random Markov chain over the vocabulary,
    each token followed by one of 3 likely successors most of the time."""
    config = read_config(fixture)
    vocab = config["model"]["vocab_size"]
    rng = np.random.default_rng(20240520)
    successors = rng.integers(0, vocab, size=(vocab, 3))
    tokens = [int(rng.integers(0, vocab))]
    for _ in range(2047):
        if rng.random() < 0.85:
            tokens.append(int(successors[tokens[-1], rng.integers(0, 3)]))
        else:
            tokens.append(int(rng.integers(0, vocab)))
    write_token_shard(os.path.join(fixture, "tokens.bin"), tokens)


def gpt(fixture):
    config = read_config(fixture)
    m = config["model"]
    model = Gpt(m)
    named = model.named_for_zest()
    load_initial(named, os.path.join(fixture, "init.safetensors"))
    tokens = read_token_shard(os.path.join(fixture, "tokens.bin"))
    if config.get("data", {}).get("val_fraction", 0.0) != 0.0:
        sys.exit("data.val_fraction: the reference takes every window for training")
    inputs, targets = token_batches(tokens, m["seq_len"], config["seed"], config["steps"],
                                    config["train_batch_size"])
    write_safetensors(os.path.join(fixture, "batches.safetensors"),
                      {"inputs": inputs, "targets": targets})
    train(config, model, named, list(zip(inputs, targets)), fixture, {"model": "gpt"})


# Note: features of standard deviation 2 put the hidden pre-activations around 1, where tanh-GELU
# and erf-GELU differ by ~1e-4; with N(0, 1) features the fixture could not tell them apart.
MLP_FEATURE_STD = 2.0


def mlp(fixture):
    """Classification batches drawn here (N(0, MLP_FEATURE_STD^2) features, labels the argmax of
    a fixed random linear teacher), written to batches.safetensors for zest to read."""
    config = read_config(fixture)
    sizes = config["model"]["sizes"]
    model = Mlp(sizes)
    named = model.named_for_zest()
    load_initial(named, os.path.join(fixture, "init.safetensors"))
    rng = np.random.default_rng(config["seed"])
    steps, rows = config["steps"], config["train_batch_size"]
    teacher = rng.standard_normal((sizes[0], sizes[-1])).astype(np.float32)
    inputs = (MLP_FEATURE_STD * rng.standard_normal((steps, rows, sizes[0]))).astype(np.float32)
    targets = np.argmax(inputs @ teacher, axis=-1).astype(np.int32)
    write_safetensors(os.path.join(fixture, "batches.safetensors"),
                      {"inputs": inputs, "targets": targets})
    train(config, model, named, list(zip(inputs, targets)), fixture, {"model": "mlp"})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["gpt-tokens", "gpt", "mlp"])
    parser.add_argument("fixture", help="the fixture directory (holds config.json)")
    args = parser.parse_args()
    torch.manual_seed(0)  # nothing random should be drawn; the weights come from zest
    torch.set_num_threads(1)
    {"gpt-tokens": gpt_tokens, "gpt": gpt, "mlp": mlp}[args.command](args.fixture)


if __name__ == "__main__":
    main()
