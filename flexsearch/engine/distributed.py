"""Running one search across many workers with Ray (the optional `flexsearch[ray]` extra).

The driver walks the learner's rounds (`engine.loop.rounds`), splits each round's items into chunks and
hands them, with the learner's state as the earlier rounds left it, to Ray actors; each actor loads the
target model once and runs the same per-item search code (`engine.loop.search_batch`) on its chunks. Results
come back as outcome records; the driver lets the learner learn from the whole round before the next one and
is the only one to write the run directory, so resume works exactly as in a single process. A worker that dies
has its chunk re-queued to the others. Per-item searches are seeded by item and read the round's learner state,
so the split does not depend on which worker searched which item.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from tqdm.auto import tqdm

from flexsearch.config import SearchConfig, load_config
from flexsearch.data.items import Item
from flexsearch.engine.learner import Learner
from flexsearch.errors import FlexsearchError
from flexsearch.objectives import attack_eligible, get_objective


class SearchWorker:
    """One Ray actor: a loaded target model and scorer that searches chunks of items."""

    def __init__(self, target: dict[str, Any], config: dict[str, Any], objective: str) -> None:
        from flexsearch.engine.loop import build_context
        from flexsearch.scoring.scorer import build_scorer

        search_config = load_config(None, None, **{k: v for k, v in config.items()})
        self.scorer = build_scorer(dict(target), config["scoring"])
        self.ctx = build_context(search_config, self.scorer, objective)
        self.objective = objective

    def search(self, items: list[Item], learner: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The chunk's outcome records, searched with the round's learner state, and what scoring it cost (a
        served target's requests)."""
        from flexsearch.engine.learner import Learner
        from flexsearch.engine.loop import search_batch

        outcomes = search_batch(items, self.ctx, self.objective, Learner.from_dict(learner))
        return [o.to_record() for o in outcomes], self.scorer.backend.take_usage()


def _ray():
    try:
        import ray
    except ImportError:
        raise FlexsearchError("the ray backend needs Ray: pip install 'flexsearch[ray]'") from None
    return ray


def search_on_ray(
    items: Sequence[Item],
    config: SearchConfig,
    target: dict[str, Any],
    objective: str,
    on_batch_done: Callable[[list[dict[str, Any]]], None],
    progress: tqdm | None = None,
    on_usage: Callable[[dict[str, Any]], None] = lambda counters: None,
    finished: dict[str, dict[str, Any]] | None = None,
    learner: Learner | None = None,
    *,
    workers: int = 2,
    address: str | None = None,
    gpus_per_worker: float = 0,
) -> int:
    """Searches the `items` not in `finished` on `workers` Ray actors, round by round as `run_search` does;
    returns how many chunks had to be retried. `on_usage` receives each finished chunk's scoring cost (a served
    target's requests), for score.json; `learner` learns from every round."""
    from flexsearch.engine.loop import rounds

    finished = dict(finished or {})
    learner = learner if learner is not None else Learner()
    ray = _ray()
    if not ray.is_initialized():
        # Without an address Ray starts a local instance; with one it joins that cluster.
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    actor_class = ray.remote(SearchWorker)
    device = {"device": "cuda"} if gpus_per_worker else {"device": target.get("device") or "cpu"}
    actors = [actor_class.options(num_gpus=gpus_per_worker, num_cpus=1, max_restarts=0).remote(
        {**target, **device}, asdict(config), objective) for _ in range(workers)]
    idle, retries = list(actors), 0
    by_id = {it.id: it for it in items}
    searched: list[dict[str, Any]] = []
    started, goal = time.perf_counter(), get_objective(objective)
    for round_items in rounds(items, config.learner_round):
        todo = [it for it in round_items if it.id not in finished]
        queue = deque(todo[i : i + config.item_batch] for i in range(0, len(todo), config.item_batch))
        state = learner.to_dict()
        in_flight: dict[Any, tuple[Any, list[Item]]] = {}
        while queue or in_flight:
            while queue and idle:
                actor, chunk = idle.pop(), queue.popleft()
                in_flight[actor.search.remote(chunk, state)] = (actor, chunk)
            if not in_flight:
                raise FlexsearchError(f"every Ray worker died; {sum(map(len, queue))} items were not searched")
            ready, _ = ray.wait(list(in_flight), num_returns=1)
            actor, chunk = in_flight.pop(ready[0])
            try:
                records, usage = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError):
                queue.append(chunk)  # the worker is gone: another one takes its chunk
                retries += 1
                continue
            idle.append(actor)
            on_usage(usage)
            on_batch_done(records)
            finished.update({r["item_id"]: r for r in records})
            searched += records
            if progress is not None:
                wins = [r["success"] for r in searched
                        if attack_eligible(goal, by_id[r["item_id"]], r["clean_probs"])]
                rate = sum(r["queries"] for r in searched) / max(time.perf_counter() - started, 1e-9)
                progress.update(len(records))
                progress.set_postfix({f"ASR({objective})": f"{sum(wins) / len(wins):.2f}" if wins else "-",
                                      "q_per_s": f"{rate:.1f}", "workers": len(idle) + len(in_flight),
                                      "retries": retries})
        learner.observe_records(finished[it.id] for it in round_items)
    for actor in actors:
        ray.kill(actor)
    return retries
