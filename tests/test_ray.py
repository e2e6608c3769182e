"""The Ray backend on a local Ray instance with the tiny model: same split as one process; a killed
worker's items are re-queued and the split is complete."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from flexsearch import api
from flexsearch.config import load_config
from flexsearch.pipeline import search as pipeline

ray = pytest.importorskip("ray")
SETTINGS = ["constraints=[protected_spans, unique_positions, polarity_guard]",
            "operators=[{name: persona, n: 2}, {name: instruction, n: 2}, "
            "{name: textbugger, bugs: [insert, delete, swap, sub_c], positions: 1, per_position: 2}]",
            "item_batch=2", "learner_round=4"]  # two rounds of two chunks: the learner between them


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def read(run: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def test_two_workers_match_the_single_process_run(tiny_model_dir, tmp_path):
    config = load_config("default", SETTINGS, budget=10)
    target = api.Target(str(tiny_model_dir), device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a one-CPU Ray worker, so both runs do the same float arithmetic
    try:
        api.search("seed", model=target, out=tmp_path / "local", config=config, limit=8)
    finally:
        torch.set_num_threads(threads)
    api.search("seed", model=target, out=tmp_path / "ray", config=config, limit=8, ray=api.RayOptions(workers=2))
    local, distributed = read(tmp_path / "local", "split.jsonl"), read(tmp_path / "ray", "split.jsonl")
    assert [r["attack_chain"] for r in local] == [r["attack_chain"] for r in distributed]
    assert [r["queries"] for r in local] == [r["queries"] for r in distributed]
    local_families, ray_families = read(tmp_path / "local", "split-families.jsonl"), read(tmp_path / "ray",
                                                                                         "split-families.jsonl")
    assert local_families and [(r["item_id"], r["family"], r["attack_chain"]) for r in local_families] == \
        [(r["item_id"], r["family"], r["attack_chain"]) for r in ray_families]
    for a, b in zip(local, distributed, strict=True):
        assert abs(a["p_target_attacked"] - b["p_target_attacked"]) < 1e-5
    score_local = json.loads((tmp_path / "local" / "score.json").read_text())
    score_ray = json.loads((tmp_path / "ray" / "score.json").read_text())
    assert score_ray["backend"] == "ray" and score_ray["worker_retries"] == 0
    for key in ("stereotype", "anti_stereotype"):
        assert score_local[key]["asr"] == score_ray[key]["asr"]


def _own_processes(named: str) -> list[int]:
    """This test process's descendants whose command line holds `named` (Ray starts its workers below it)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            if named in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            continue
    return found


def test_a_killed_worker_loses_nothing(tiny_model_dir, tmp_path, monkeypatch):
    config = load_config("default", [*SETTINGS[:2], "item_batch=1"], budget=12)
    run = tmp_path / "killed"
    target = api.Target(str(tiny_model_dir), device="cpu")
    killed: list[int] = []
    append = pipeline.append_jsonl
    # an earlier search's workers may still be exiting (under load they outlive their search): never one of them
    earlier = set(_own_processes("ray::SearchWorker"))

    def append_then_kill_a_worker(path: Path, records: list[dict]) -> None:
        append(path, records)
        if not killed:  # the first finished batch: kill one of the workers this search started, no other
            workers = [pid for pid in _own_processes("ray::SearchWorker") if pid not in earlier]
            assert workers, "no Ray worker of this test's search found"
            killed.append(workers[0])
            os.kill(workers[0], signal.SIGKILL)

    monkeypatch.setattr(pipeline, "append_jsonl", append_then_kill_a_worker)
    api.search("seed", model=target, out=run, config=config, limit=16, ray=api.RayOptions(workers=2))
    assert killed
    trace = [(r["objective"], r["item_id"]) for r in read(run, "trace.jsonl")]
    assert len(trace) == len(set(trace)) == 32  # 16 items × 2 objectives, none lost, none twice
    assert len(read(run, "split.jsonl")) == 16
    assert json.loads((run / "score.json").read_text())["worker_retries"] >= 1
