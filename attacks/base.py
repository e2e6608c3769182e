"""The operator and constraint protocols and their registries.

An operator proposes new candidates from one candidate; a constraint accepts or rejects proposed
candidates. Add an operator by writing one class in this folder and decorating it with
`@OPERATORS.register("name")`; its constructor's keyword arguments are its YAML settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np

from flexsearch.candidate import Candidate
from flexsearch.errors import FlexsearchError
from flexsearch.model import TargetModel
from flexsearch.registry import Registry

Position = tuple[str, int]  # (field, word index)


@dataclass
class AttackResources:
    """What operators and constraints may draw on besides their own settings."""

    target: TargetModel | None = None  # the white-box target (embedding neighbours, gradients)


class Operator(Protocol):
    name: ClassVar[str]
    edits_words: ClassVar[bool]  # True: word edits at positions; False: instruction templates

    def __init__(self, resources: AttackResources, **settings: Any) -> None: ...

    def propose(self, candidate: Candidate, rng: np.random.Generator,
                positions: Sequence[Position] | None = None) -> list[Candidate]:
        """New candidates from `candidate` (each records its edit and parent). Word operators edit the
        given positions, or positions they pick themselves when None."""
        ...


class Constraint(Protocol):
    name: ClassVar[str]

    def __init__(self, resources: AttackResources, **settings: Any) -> None: ...

    def accept(self, candidates: Sequence[Candidate]) -> list[bool]: ...


OPERATORS: Registry[Operator] = Registry("operator")
CONSTRAINTS: Registry[Constraint] = Registry("constraint")


T = TypeVar("T", Operator, Constraint)


def build(registry: Registry[T], spec: dict[str, Any] | str, resources: AttackResources) -> T:
    """An operator or constraint from its YAML spec: a name, or {name: ..., setting: value...}."""
    settings = {"name": spec} if isinstance(spec, str) else dict(spec)
    cls = registry.get(settings.pop("name"))
    try:
        return cls(resources=resources, **settings)
    except TypeError as err:
        raise FlexsearchError(f"{registry.kind} '{cls.name}': bad settings {settings} ({err})") from None
