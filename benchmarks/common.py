"""Shared pieces of the benchmark scripts: BBQ prompts, timing, machine facts, RESULTS.md."""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flexsearch.candidate import Candidate
from flexsearch.items import Item, load_items

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BBQ = ROOT.parent / "shared" / "data" / "bbq"


def bbq_items(category: str = "Age", limit: int = 48, condition: str | None = None) -> list[Item]:
    """Real BBQ items (benchmarks may read ../shared; tests may not)."""
    items = load_items(BBQ / f"{category}.jsonl").items
    if condition:
        items = [it for it in items if it.condition == condition]
    return items[:limit]


def roots(items: list[Item]) -> list[Candidate]:
    return [Candidate.root(it) for it in items]


def timed(fn: Callable[[], Any], repeats: int = 1) -> tuple[Any, float]:
    """(result of the last call, best wall time over `repeats`)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, best


def machine() -> str:
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    return (f"{os.cpu_count()} cores, {device}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
            f"Python {platform.python_version()}")


def matmul_flops(dtype: torch.dtype = torch.float32, size: int = 1536, repeats: int = 8,
                 device: str = "cpu") -> float:
    """The machine's dense matmul throughput (FLOP/s) in this dtype, best of a few runs."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    torch.matmul(a, b)

    def run() -> None:
        for _ in range(repeats):
            torch.matmul(a, b)
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    _, seconds = timed(run, repeats=3)
    return 2 * size**3 * repeats / seconds


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(x: Any) -> str:
        return f"{x:.4g}" if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def record(title: str, body: str) -> None:
    """Prints the section and appends it to RESULTS.md with date, machine and the exact command."""
    command = " ".join(shlex.quote(a) for a in ["python", *sys.orig_argv[1:]])
    section = (f"\n## {title}\n\n{datetime.datetime.now():%Y-%m-%d %H:%M} · {machine()}\n\n"
               f"Command: `{command}`\n\n{body}\n")
    print(section)
    with RESULTS.open("a", encoding="utf-8") as handle:
        handle.write(section)
