"""The target a run attacks: a model spec with its options (in process or served), and how a search
spreads over Ray."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from flexsearch.attacks.base import white_box_problems
from flexsearch.config import SearchConfig
from flexsearch.scoring.backends.served_options import ServedFields, is_served, served_options
from flexsearch.scoring.model import requested_model


@dataclass(frozen=True)
class Target(ServedFields):
    """The model to attack: a Hugging Face id, local directory, .gguf file or alias loaded in process, or
    `openai:NAME` served at `base_url` (an OpenAI-compatible /v1 root), with its options. A served model's options
    (base_url, served_mode, top_logprobs, samples, temperature, concurrency, request_timeout, retries,
    request_cache; keyword-only) are ServedFields', declared once beside the served backend; the API key comes from
    FLEXSEARCH_API_KEY or OPENAI_API_KEY only."""

    model: str = "smollm2"
    adapter: str | None = None
    device: str | None = None
    dtype: str | None = None
    trust_remote_code: bool = False

    def arguments(self) -> dict[str, Any]:
        """The model spec and its options (build_backend's argument; also what Ray workers receive)."""
        return asdict(self)

    def requested(self, scoring_mode: str) -> dict[str, Any]:
        """What the loaded (or connected) target will record, known before: checks a served target's options."""
        served = served_options(self.arguments(), scoring_mode)
        if served is None:
            return requested_model(self.arguments())
        return {"model": self.model, "served": served.result_settings()}

    def white_box_problem(self, config: SearchConfig, overrides: Sequence[str] = ()) -> str | None:
        """Why a served target cannot run this (gradients, optimised suffixes, the target's embeddings, prefix
        key/value reuse are white-box only), or None."""
        if not is_served(self.model):
            return None
        where = f"--model {self.model} is served (black-box)"
        for option, value, instead in (("proposals", config.proposals, "sampled"),
                                       ("importance", config.importance, "leave_one_out")):
            if value == "gradient":
                return (f"{where}: {option}: gradient takes gradients of the target's weights (white-box only); "
                        f"use --set {option}={instead}")
        problems = white_box_problems(config.operators)
        if problems:
            return f"{where}: {problems[0]}"
        if any(o.replace(" ", "").lower() in ("scoring.prefix_reuse=true", "scoring.prefix_reuse=1")
               for o in overrides):
            return f"{where}: scoring.prefix_reuse reuses the target's key/value cache (white-box only; servers " \
                   "such as vLLM cache prefixes themselves)"
        return None


@dataclass(frozen=True)
class RayOptions:
    """Spread a search's items over Ray workers (each loads the model once)."""

    workers: int = 2
    address: str | None = None  # join this cluster (default: start a local one)
    gpus_per_worker: float = 0


def as_target(model: str | Target) -> Target:
    return model if isinstance(model, Target) else Target(model=model)
