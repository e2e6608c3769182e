"""The backend seam: what a scoring backend does (`ScoringBackend`) and the registry that picks one by the model
spec's prefix (`BACKENDS`: `openai:NAME` is served, anything else loads in process). A new backend is one file in
this folder that registers its class under its prefix (and a line in backends/__init__.py that imports it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from flexsearch.data.candidate import Candidate
from flexsearch.data.render import PromptFormat
from flexsearch.registry import Registry
from flexsearch.scoring.model import TargetModel

if TYPE_CHECKING:
    from flexsearch.config import ScoringConfig


class ScoringBackend(Protocol):
    """Where rendered prompts are scored: P(A), P(B), P(C) per prompt, and what it cost (DESIGN.md "Scoring
    backends"). In process (`InProcessBackend`, white-box) or behind an OpenAI-compatible server
    (`backends/served.py`, `ServedBackend`, black-box); the search loop and every command hold a `Scorer` over
    one and never ask which."""

    fmt: PromptFormat
    info: dict[str, Any]  # provenance: recorded in config.yaml and score.json

    @property
    def white_box(self) -> TargetModel | None:
        """The loaded model (gradients, embeddings, fine-tuning); None when served."""
        ...

    queries_per_prompt: int  # what one prompt costs the budget (samples per prompt in sample mode)
    max_prompt_tokens: int  # longer prompts are skipped (a served model's context is the server's to enforce)

    def render(self, candidate: Candidate) -> str: ...

    def prompt_tokens(self, prompt: str) -> int | None:
        """The prompt's length in the target's tokens; None when only the server knows it."""
        ...

    def letter_probs(self, prompts: Sequence[str]) -> np.ndarray:
        """(N, 3): P(A), P(B), P(C) for each prompt (letters in displayed order); no caching."""
        ...

    def usage(self) -> dict[str, Any]:
        """What scoring cost beyond prompts (requests, tokens, retries, cache hits); empty in process."""
        ...

    def progress(self) -> dict[str, str]:
        """Fields for the progress bar (requests/s, retries); empty in process."""
        ...

    def take_usage(self) -> dict[str, Any]:
        """The raw cost counters gathered since the last call, then reset (a Ray worker reports its share)."""
        ...

    def merge_usage(self, counters: dict[str, Any]) -> None:
        """Adds another process's take_usage() to this backend's cost."""
        ...


class Backend(Protocol):
    """A backend class as the registry holds it: `connect` turns the model spec and its options (api.Target's
    fields, `target`) into a ready backend (a model loaded, a server reached); its `name` is the spec prefix it
    serves (`openai` for `openai:NAME`)."""

    name: ClassVar[str]

    @classmethod
    def connect(cls, target: dict[str, Any], scoring: ScoringConfig) -> ScoringBackend: ...


BACKENDS: Registry[Backend] = Registry("scoring backend")
IN_PROCESS = "in_process"  # the backend of every spec whose prefix names no other: a model loaded here


def load_backends() -> None:
    """Imports every module that registers a backend (backends.REGISTERED)."""
    import importlib

    from flexsearch.scoring.backends import REGISTERED

    for module in REGISTERED:
        importlib.import_module(module)


def backend_name(spec: str) -> str:
    """The registered backend a model spec asks for: its prefix before ':' when one is registered under it (a
    Windows path's drive letter or a hub id is not), else the in-process backend."""
    prefix, colon, _ = spec.partition(":")
    return prefix if colon and prefix != IN_PROCESS and prefix in BACKENDS else IN_PROCESS
