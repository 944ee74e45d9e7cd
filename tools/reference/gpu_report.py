#!/usr/bin/env python3
"""Writes the Markdown summary of a tools/gpu-check.sh run (report.md) from what its phases left
in OUT: phases.tsv (each phase's exit status and time), the Google Benchmark JSON of
adamw_cuda_bench and gpt_cuda_bench, and the JSON lines of the torch reference scripts, each
read from OUT or else from OUT/results.tar.gz (where gpu-check.sh packs them). Any of them may be
missing (a phase that failed or had no time left): the report says so and goes on. Standard
library only.

    gpu_report.py OUT > OUT/report.md
"""

import json
import os
import re
import sys
import tarfile

ADAMW_GOAL = 0.85       # of the copy's GB/s, from 100M parameters
ADAMW_GOAL_FROM = 100_000_000


RESULTS_ARCHIVE = "results.tar.gz"


def archived(out):
    """{name: text} of OUT/results.tar.gz's files (empty without one)."""
    files = {}
    try:
        with tarfile.open(os.path.join(out, RESULTS_ARCHIVE)) as archive:
            for member in archive.getmembers():
                if member.isfile():
                    files[os.path.basename(member.name)] = (
                        archive.extractfile(member).read().decode(errors="replace"))
    except (OSError, tarfile.TarError):
        pass
    return files


def read_text(path):
    """The file's text, else its namesake's in the results archive beside it, else None."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return archived(os.path.dirname(path)).get(os.path.basename(path))


def result_names(out):
    """The names of the result files in OUT and in its results archive."""
    names = set(archived(out))
    if os.path.isdir(out):
        names.update(os.listdir(out))
    return sorted(names)


def read_json(path):
    try:
        return json.loads(read_text(path) or "")
    except ValueError:
        return None


def read_lines(path):
    records = []
    for line in (read_text(path) or "").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
    return records


def benchmark_rows(document):
    """Google Benchmark JSON -> the per-run rows (no aggregates)."""
    if not document:
        return []
    return [b for b in document.get("benchmarks", []) if b.get("run_type", "iteration") ==
            "iteration"]


def number(value, digits=3):
    if value is None:
        return "–"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}"
    return str(value)


def millions(params):
    return f"{params / 1e6:g}M" if params < 10**9 else f"{params / 1e9:g}B"


def logged_errors(out, prefix):
    """The distinct lines of gpu-check.log that start with `prefix` (a program's one-line
    error, such as World refusing world.device cuda)."""
    try:
        with open(os.path.join(out, "gpu-check.log"), errors="replace") as f:
            return list(dict.fromkeys(line.strip() for line in f if line.startswith(prefix)))
    except OSError:
        return []


def phases_table(out):
    lines = ["| phase | exit status | seconds | note |", "| --- | --- | --- | --- |"]
    try:
        with open(os.path.join(out, "phases.tsv")) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t") + ["", "", "", ""]
                lines.append("| " + " | ".join(fields[:4]) + " |")
    except OSError:
        lines.append("| (no phases.tsv) | | | |")
    return lines


def adamw_section(out):
    zest = benchmark_rows(read_json(os.path.join(out, "adamw_cuda_bench.json")))
    torch = read_lines(os.path.join(out, "torch_adamw.jsonl"))
    lines = ["## AdamW on the GPU (`adamw_cuda_bench`, `torch_adamw_bench.py`)", "",
             "GB/s at 28 bytes a parameter (read p, g, m, v; write p, m, v), 30 with the bf16 "
             "copy (zest: fused in the same pass; torch: step, then a cast); the copy is a "
             "device-to-device copy moving the same bytes, measured in the same run. Medians of "
             "CUDA-event times.", ""]
    if not zest and not torch:
        errors = ["- " + line for line in logged_errors(out, "adamw_cuda_bench: error:")]
        return lines + ["No results (see the phases above)."] + ([""] + errors if errors else [])
    by_size = {}
    errors = []
    for row in zest:
        match = re.search(r"params:(\d+)", row.get("run_name", row.get("name", "")))
        if not match:
            continue
        params = int(match.group(1))
        kind = row.get("run_name", row["name"]).split("/")[0]
        if row.get("error_occurred"):
            errors.append(f"- zest {kind} at {millions(params)}: {row.get('error_message')}")
            continue
        by_size.setdefault(params, {})["zest " + kind] = row
    for record in torch:
        if record.get("bench") == "error":
            where = f" at {millions(record['params'])}" if "params" in record else ""
            errors.append(f"- torch{where}: {record.get('error')}")
        elif "params" in record:
            by_size.setdefault(record["params"], {})["torch " + record["bench"]] = record
    lines += ["| params | copy GB/s | AdamW GB/s | of copy | + bf16 copy GB/s | of copy | "
              "torch copy GB/s | torch fused AdamW GB/s | of torch copy | torch + cast GB/s | "
              "zest / torch params/s | zest bf16 / torch + cast |",
              "| " + " | ".join(["---"] * 12) + " |"]
    goal = []
    for params in sorted(by_size):
        row = by_size[params]
        get = lambda key, field: row.get(key, {}).get(field)  # noqa: E731
        zest_rate = get("zest BM_AdamW", "params_per_s")
        torch_rate = get("torch adamw", "params_per_s")
        zest_rounded = get("zest BM_AdamWBf16Copy", "params_per_s")
        torch_rounded = get("torch adamw_then_bf16", "params_per_s")
        ratio = zest_rate / torch_rate if zest_rate and torch_rate else None
        rounded_ratio = zest_rounded / torch_rounded if zest_rounded and torch_rounded else None
        lines.append("| " + " | ".join([
            millions(params), number(get("zest BM_CopyCeiling", "GB_per_s")),
            number(get("zest BM_AdamW", "GB_per_s")), number(get("zest BM_AdamW", "of_copy")),
            number(get("zest BM_AdamWBf16Copy", "GB_per_s")),
            number(get("zest BM_AdamWBf16Copy", "of_copy")),
            number(get("torch copy", "GB_per_s")), number(get("torch adamw", "GB_per_s")),
            number(get("torch adamw", "of_copy")), number(get("torch adamw_then_bf16", "GB_per_s")),
            number(ratio), number(rounded_ratio)]) + " |")
        of_copy = get("zest BM_AdamW", "of_copy")
        if params >= ADAMW_GOAL_FROM and of_copy is not None:
            goal.append((params, of_copy))
    if goal:
        met = all(of_copy >= ADAMW_GOAL for _, of_copy in goal)
        lines += ["", f"Goal (AdamW >= {ADAMW_GOAL} of the copy from "
                      f"{millions(ADAMW_GOAL_FROM)}): **{'met' if met else 'not met'}** ("
                  + ", ".join(f"{millions(p)} {r:.3f}" for p, r in goal) + ")."]
    errors += ["- " + line for line in logged_errors(out, "adamw_cuda_bench: error:")]
    if errors:
        lines += ["", "Errors:"] + errors
    return lines


def gpt_section(out):
    lines = ["## GPT training step (`gpt_cuda_bench`, `torch_gpt_bench.py`)", "",
             "bf16, one GPU, AdamW, random tokens. MFU: (6·N·B·T + 12·L·C·T·B·T) FLOPs a step "
             "(N without wpe; attention over the full T×T) over the bf16 GEMM rate measured in "
             "the same process. Peaks: zest's allocator by category; torch's "
             "max_memory_allocated, with parameters, gradients and optimizer state as tensors.",
             ""]
    rows = []
    errors = []
    for name in result_names(out):
        if not (name.startswith("gpt_cuda_bench") and name.endswith(".json")):
            continue
        for row in benchmark_rows(read_json(os.path.join(out, name))):
            run_name = row.get("run_name", row.get("name", ""))
            if not run_name.startswith(("BM_GptStep", "BM_GptOffload")):
                continue
            parts = run_name.split("/")
            label = f"zest {parts[1]} {parts[2] if len(parts) > 2 else ''}"
            if run_name.startswith("BM_GptOffload"):
                label += " offload"
            if row.get("error_occurred"):
                errors.append(f"- {label}: {row.get('error_message')}")
            else:
                rows.append((label, row))
    for record in read_lines(os.path.join(out, "torch_gpt.jsonl")):
        label = (f"torch {record.get('model')} {record.get('mode')} {record.get('attention')}"
                 f" batch {record.get('batch')}")
        if "error" in record:
            errors.append(f"- {label}: {record['error']}")
        else:
            rows.append((label, record))
    errors += ["- " + line for line in logged_errors(out, "gpt_cuda_bench: error:")]
    if not rows:
        return lines + ["No results (see the phases above)."] + ([""] + errors if errors else [])
    lines += ["Peak MiB: params, grads, optimizer (fp32 master and moments), activations; other "
              "is, for zest, the gather, buckets and workspace peaks, for torch the allocated "
              "peak less the model state (activations included); device is what the process "
              "held (zest: cudaMemGetInfo; torch: max_memory_reserved).", "",
              "fwd+bwd ms is zest's time until the compute stream has finished backward (the "
              "rest of the step is the last reductions and the optimizer).", "",
              "| run | step ms | fwd+bwd ms | tokens/s | model TFLOP/s | GEMM TFLOP/s | MFU | "
              "peak total | params | grads | optimizer | activations | other | device |",
              "| " + " | ".join(["---"] * 14) + " |"]
    for label, row in rows:
        other = row.get("other_at_peak_MiB")
        if other is None and "peak_workspace_MiB" in row:
            other = sum(row.get(f"peak_{c}_MiB", 0.0) for c in ("gather", "buckets", "workspace"))
        lines.append("| " + " | ".join([
            label, number(row.get("step_ms")), number(row.get("forward_backward_ms")),
            number(row.get("tokens_per_s")),
            number(row.get("model_TFLOPs")), number(row.get("gemm_TFLOPs")),
            number(row.get("mfu")), number(row.get("peak_total_MiB")),
            number(row.get("peak_params_MiB")), number(row.get("peak_grads_MiB")),
            number(row.get("peak_optimizer_MiB")), number(row.get("peak_activations_MiB")),
            number(other),
            number(row.get("device_used_MiB", row.get("peak_reserved_MiB")))]) + " |")
    for label, row in rows:
        if label.endswith(" offload") and "device_cap_MiB" in row:
            lines += ["", f"{label}: GPU capped at {number(row.get('device_cap_MiB'))} MiB "
                      f"(the stage-3 run peaked at {number(row.get('stage3_peak_MiB'))} MiB); "
                      f"device peak {number(row.get('peak_total_MiB'))} MiB, host arena "
                      f"{number(row.get('host_offload_MiB'))} MiB; step time "
                      f"{number(row.get('offload_slowdown'))}x the stage-3 run's."]
    torch_rates = {label: row["tokens_per_s"] for label, row in rows
                   if label.startswith("torch") and row.get("tokens_per_s")}
    zest_rates = {label: row["tokens_per_s"] for label, row in rows
                  if label.startswith("zest") and row.get("tokens_per_s")}
    pairs = [f"- {zest_label} / {torch_label}: {zest_rate / torch_rate:.3f}"
             for zest_label, zest_rate in zest_rates.items()
             for torch_label, torch_rate in torch_rates.items()
             if torch_label.split()[1] == zest_label.split()[1]]  # the same model
    if pairs:
        lines += ["", "zest / torch tokens/s (same model):"] + pairs
    if errors:
        lines += ["", "Errors:"] + errors
    return lines


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_report.py OUT")
    out = sys.argv[1]
    context = (read_json(os.path.join(out, "adamw_cuda_bench.json")) or {}).get("context", {})
    lines = ["# gpu-check report", ""]
    if context:
        lines += [f"{context.get('date', '')}, {context.get('gpu', 'GPU ?')}, CUDA runtime "
                  f"{context.get('cuda_runtime', '?')}, driver {context.get('cuda_driver', '?')}, "
                  f"host {context.get('host_name', '?')} ({context.get('num_cpus', '?')} CPUs)",
                  ""]
    lines += ["## Phases", ""] + phases_table(out) + [""]
    lines += adamw_section(out) + [""] + gpt_section(out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
