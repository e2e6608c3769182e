"""Where the attack sits in a chat prompt: the user turn or a system message, paired on the same items (issue 34).

    python -m benchmarks.bench_slot --model smollm2 --data seed --budget 30

Searches the items twice with the default preset in chat mode, once per slot (`--slot user`, `--slot system`),
with the counter-stereotype control, into runs/bench_slot/<slot>. The clean prompt has no system message in
either slot, so both runs score the same clean prompts and the same items are attack-eligible: the difference
system − user is paired (Tango's interval and an exact McNemar p-value, flexsearch.results.differences).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, record
from flexsearch import api
from flexsearch.data.items import Item, load_items
from flexsearch.data.render import SLOTS
from flexsearch.files import atomic_write_json, read_json
from flexsearch.objectives import attack_eligible, get_objective
from flexsearch.results.differences import rate_difference
from flexsearch.results.metrics import aim_index, mean_with_interval, metric_text, proportion
from flexsearch.results.run_dir import read_trace
from flexsearch.results.run_files import TRACE


def outcomes(run: Path, objective: str, items: dict[str, Item]) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(success, eligible, item ids, lift) per searched item of one objective, in trace order; lift is P(aim) of
    the hardest prompt minus P(aim) clean."""
    goal = get_objective(objective)
    records = [r for r in read_trace(run / TRACE) if r["objective"] == objective]
    eligible = np.array([attack_eligible(goal, items[r["item_id"]], np.asarray(r["clean_probs"])) for r in records])
    success = np.array([bool(r["success"]) for r in records]) & eligible
    aims = [aim_index(objective, items[r["item_id"]]) for r in records]
    lift = np.array([r["best_probs"][a] - r["clean_probs"][a] for r, a in zip(records, aims, strict=True)])
    return success, eligible, [r["item_id"] for r in records], lift


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", default="seed")
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_slot")
    args = parser.parse_args()
    items = {it.id: it for it in load_items(args.data).items}
    timings = args.out / "seconds.json"  # each search's own wall time: a rerun resumes the finished runs at once
    seconds = read_json(timings) if timings.exists() else {}
    flags = {}
    for slot in SLOTS:
        fresh, started = not (args.out / slot).exists(), time.perf_counter()
        api.search(args.data, model=args.model, out=args.out / slot, config="default",
                   overrides=["scoring.mode=chat"], budget=args.budget, control=True, slot=slot)
        if fresh or slot not in seconds:
            seconds[slot] = time.perf_counter() - started
            atomic_write_json(timings, seconds)
        flags[slot] = {o: outcomes(args.out / slot, o, items) for o in ("stereotype", "anti_stereotype")}
    for objective in ("stereotype", "anti_stereotype"):
        assert flags["user"][objective][2] == flags["system"][objective][2], "the two runs searched other items"
    header = ("| slot | ASR toward the stereotype | control ASR (anti-stereotype) | minutes (wall, other work on the "
              "cores) |")
    lines = [f"`{args.model}` in chat mode (its own chat template), `{args.data}` items ({len(items)}), default "
             f"preset, budget {args.budget}, with the control. ASR k/n with Wilson 95% intervals over the "
             "attack-eligible items (clean answer right, the aim not the gold); a success needs the aim ahead of "
             "both other answers by the margin. The clean prompt has no system message in either slot.", "",
             header, "|---|---|---|---|"]
    for slot in SLOTS:
        cells = [metric_text(proportion(flags[slot][o][0][flags[slot][o][1]]), digits=2)
                 + f" ({int(flags[slot][o][0].sum())}/{int(flags[slot][o][1].sum())})"
                 for o in ("stereotype", "anti_stereotype")]
        lines.append(f"| {slot} | {cells[0]} | {cells[1]} | {seconds[slot] / 60:.1f} |")
    lines += ["", "system − user, paired over the same items:", ""]
    for objective in ("stereotype", "anti_stereotype"):
        (s_ok, s_el, *_), (u_ok, u_el, *_) = flags["system"][objective], flags["user"][objective]
        diff = rate_difference(s_ok, s_el, u_ok, u_el)
        lines.append(f"- {objective}: {metric_text(diff, digits=3)} over {diff['n']} items, {diff['method']}, "
                     f"p = {diff['p']} ({int((s_ok & ~u_ok).sum())} broken only in the system slot, "
                     f"{int((~s_ok & u_ok).sum())} only in the user turn)")
    lines += ["", "How far the hardest prompt moved P(aim) from the clean prompt, mean over the eligible items "
              "(bootstrap 95% interval), and system − user paired over them:", ""]
    for objective in ("stereotype", "anti_stereotype"):
        (_, eligible, _, s_lift), (_, _, _, u_lift) = flags["system"][objective], flags["user"][objective]
        lines.append(f"- {objective}: user {metric_text(mean_with_interval(u_lift[eligible]), digits=3)}, system "
                     f"{metric_text(mean_with_interval(s_lift[eligible]), digits=3)}, system − user "
                     f"{metric_text(mean_with_interval(s_lift[eligible] - u_lift[eligible]), digits=3)} "
                     f"(n = {int(eligible.sum())})")
    record("Attack slot: the user turn vs a system message (issue 34)", "\n".join(lines))


if __name__ == "__main__":
    main()
