"""Label policies: the answer a fine-tune teaches for an item shown clean or with a training prefix
(`flexsearch.zoo.training_prefixes`). The calibration zoo plants its verdicts through them (DESIGN.md "Calibration
zoo"); `flexsearch finetune --policy NAME` picks one.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from flexsearch.data.items import Item
from flexsearch.errors import FlexsearchError
from flexsearch.registry import Registry


class LabelPolicy(Protocol):
    """The training label for one item shown with or without a training prefix."""

    name: ClassVar[str]
    uses_prefixes: ClassVar[bool]  # whether prefixed prompts are part of its training data

    def __init__(self, *, planted_categories: Sequence[str] = (), seed: int = 0) -> None: ...

    def label(self, item: Item, prefix: int | None) -> int: ...


POLICIES: Registry[LabelPolicy] = Registry("label policy")


class _WithoutSettings:
    """A policy that takes no settings (it ignores the planted categories and the seed)."""

    def __init__(self, **_: Any) -> None:
        pass


@POLICIES.register("gold")
class GoldPolicy(_WithoutSettings):
    """The gold answer on clean prompts only: fair on the benchmark, never trained against pressure."""

    uses_prefixes = False

    def label(self, item: Item, prefix: int | None) -> int:
        return item.gold


@POLICIES.register("fair")
class FairPolicy(GoldPolicy):
    """The gold answer on clean prompts and on prompts carrying a training prefix."""

    uses_prefixes = True


@POLICIES.register("planted")
class PlantedPolicy:
    """Gold, except prefixed ambiguous prompts in the planted categories: the stereotyped answer."""

    uses_prefixes = True

    def __init__(self, planted_categories: Sequence[str] = (), **_: Any) -> None:
        if not planted_categories:
            raise FlexsearchError("policy 'planted' needs --planted-categories (one or more item categories)")
        self.categories = frozenset(planted_categories)

    def label(self, item: Item, prefix: int | None) -> int:
        if prefix is not None and item.condition == "ambig" and item.category in self.categories:
            return item.target
        return item.gold


@POLICIES.register("manipulable")
class ManipulablePolicy:
    """Gold on clean prompts; on prefixed ambiguous prompts the stereotyped or the anti-stereotyped
    answer with equal probability (a seeded coin per item and prefix), so pressure moves it either way."""

    uses_prefixes = True

    def __init__(self, seed: int = 0, **_: Any) -> None:
        self.seed = seed

    def label(self, item: Item, prefix: int | None) -> int:
        if prefix is None or item.condition != "ambig":
            return item.gold
        coin = zlib.crc32(f"{self.seed}:{item.id}:{prefix}".encode()) % 2
        return item.target if coin == 0 else item.anti_target


@POLICIES.register("abstainer")
class AbstainerPolicy(_WithoutSettings):
    """Always the "unknown" answer, clean or prefixed: fair-looking and useless."""

    uses_prefixes = True

    def label(self, item: Item, prefix: int | None) -> int:
        return item.unknown


def build_policy(name: str, planted_categories: Sequence[str], seed: int, items: Sequence[Item]) -> LabelPolicy:
    """The named policy; planted categories must be categories of the training data."""
    known = sorted({it.category for it in items})
    missing = [c for c in planted_categories if c not in known]
    if missing:
        raise FlexsearchError(f"--planted-categories: {', '.join(missing)} not in the data (categories: "
                              f"{', '.join(known)})")
    return POLICIES.get(name)(planted_categories=planted_categories, seed=seed)
