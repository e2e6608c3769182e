"""Memory per batch size and dtype (peak RSS while scoring; peak GPU allocation on CUDA) and how cost scales
with prompt length and item count.

    python -m benchmarks.bench_resources [--model smollm2] [--dtypes float32,bfloat16] [--memory-only]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks.common import ROOT, bbq_items, markdown_table, record, roots, timed
from flexsearch.config import load_config
from flexsearch.engine.loop import build_context, run_search
from flexsearch.scoring.model import load_target
from flexsearch.scoring.scorer import Scorer

BATCH_SIZES = (1, 4, 16, 32)


STATUS = Path("/proc/self/status")


def rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) from Linux's /proc; elsewhere the process's lifetime peak for both."""
    if not STATUS.exists():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = next(line for line in STATUS.read_text().splitlines() if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def peak_for_batch(model: str, dtype: str, batch: int) -> dict[str, float]:
    """Run in a fresh process per batch size; the peak is reset after the load (Linux), so it is scoring's own."""
    target = load_target(model, dtype=dtype)
    if STATUS.exists():
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the load's peak is not scoring's
    before = rss_mb("VmRSS")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    Scorer.in_process(target, batch_size=batch, prefix_reuse=False).score(roots(bbq_items("Age", 32)))
    gpu = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else float("nan")
    return {"rss_after_load_mb": before, "peak_rss_mb": rss_mb("VmHWM"), "peak_gpu_mb": gpu}


def time_per_item(target, items, context_repeat: int) -> float:
    """Seconds per item for a fixed-cost search (4 template candidates per item, no early stop)."""
    config = load_config("templates_only", ["stop_on_success=false", "steps=1"], budget=9, control=False)
    config = replace(config, scoring=replace(config.scoring, average_orders=False))
    long_items = [replace(it, context=" ".join([it.context] * context_repeat)) for it in items]
    ctx = build_context(config, Scorer.in_process(target), "stereotype")
    _, seconds = timed(lambda: run_search(long_items, ctx, "stereotype"))
    return seconds / len(items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtypes", default="float32", help="comma-separated dtypes for the memory table")
    parser.add_argument("--memory-only", action="store_true", help="skip the time-scaling tables")
    parser.add_argument("--child-batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_batch:
        print(json.dumps(peak_for_batch(args.model, args.dtypes, args.child_batch)))
        return
    memory_rows = []
    for dtype in args.dtypes.split(","):
        for batch in BATCH_SIZES:
            out = subprocess.run([sys.executable, "-m", "benchmarks.bench_resources", "--model", args.model,
                                  "--dtypes", dtype, "--child-batch", str(batch)],
                                 cwd=ROOT, capture_output=True, text=True, check=True)
            peak = json.loads(out.stdout.strip().splitlines()[-1])
            memory_rows.append([dtype, batch, peak["rss_after_load_mb"], peak["peak_rss_mb"],
                                peak["peak_rss_mb"] - peak["rss_after_load_mb"], peak["peak_gpu_mb"]])
    memory = (f"Memory, scoring 32 BBQ prompts on `{args.model}` (peak RSS reset after the load, Linux):\n\n"
              + markdown_table(["dtype", "batch", "RSS after load (MB)", "peak RSS while scoring (MB)",
                                "scoring overhead (MB)", "peak GPU allocated (MB)"], memory_rows))
    if args.memory_only:
        record("Memory while scoring", memory)
        return
    target = load_target(args.model)
    items = bbq_items("Religion", 16, condition="ambig")
    length_rows = [[r, time_per_item(target, items[:6], r)] for r in (1, 2, 4)]
    count_rows = [[n, time_per_item(target, items[:n], 1)] for n in (4, 8, 16)]
    body = (memory
            + "\n\nTime per item vs prompt length (context repeated r times; 6 items, 4 template prompts each):\n\n"
            + markdown_table(["r", "s per item"], length_rows)
            + "\n\nTime per item vs item count (same search):\n\n"
            + markdown_table(["items", "s per item"], count_rows))
    record("Memory and scaling", body)


if __name__ == "__main__":
    main()
