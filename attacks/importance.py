"""Word importance for greedy attacks from leave-one-out probes (black-box; the white-box ranking is
`flexsearch.attacks.gradient.word_saliency`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from flexsearch.attacks.base import Position
from flexsearch.data.candidate import Candidate


def leave_one_out_probes(candidate: Candidate, positions: Sequence[Position]) -> list[Candidate]:
    """One probe per position with that word deleted; score them, then call `importance_from_probes`."""
    return [candidate.with_words("leave_one_out", f, i, "") for f, i in positions]


def importance_from_probes(base_value: float, probe_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """How much deleting each word moves the objective toward the attacker (higher = more important)."""
    return np.asarray(probe_values, dtype=float) - base_value
