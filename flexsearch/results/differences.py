"""Differences of two success rates with intervals and tests that hold at small n (DESIGN.md "Metrics",
"Differences of rates").

A difference of rates here is ASR toward one answer minus ASR toward another (the fairness gap), or run B's rate
minus run A's on shared items (compare). Each rate has its own eligible items; the items eligible both ways are
paired. When every item is paired (an all-ambiguous run: the eligible sets coincide), the interval is Tango's
score interval for a paired difference and the test is the exact McNemar test on the discordant items. Otherwise
the interval is Newcombe's hybrid score (MOVER) interval from the two Wilson intervals, with the correlation the
shared items give, and the test is Fisher's exact test on the two rates as if independent (conservative when the
shared items agree more than chance).

Both intervals carry a continuity correction, chosen by exact coverage (every outcome table enumerated, no
simulation) on a grid of n = 2-30, rates 0.05-0.95, correlation 0 and 0.5: without it Tango's interval covered
as little as 0.919 (n = 5) and the MOVER interval 0.870 (n = 2) against a nominal 0.95; with it the least is 0.937,
for 6-18% more width (DESIGN.md "Differences of rates"; `benchmarks/bench_intervals.py`). The MOVER path's
correction is Newcombe's own (his method 11: continuity-corrected Wilson intervals); Tango's takes TANGO_CORRECTION
off |b − c − nΔ|, the least of 0.25 and 0.5 that held every cell.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

Z_95 = 1.959964  # two-sided 95% normal quantile
TANGO_CORRECTION = 0.25  # taken off Tango's score numerator (the module's note says why)


def wilson_interval(successes: int, n: int, z: float = Z_95, continuity: bool = False) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (n > 0); with `continuity`, Newcombe's (1998) continuity-
    corrected form (his method 4)."""
    p = successes / n
    if continuity:
        low = 0.0 if successes == 0 else (2 * n * p + z * z - 1 - z * math.sqrt(
            max(z * z - 2 - 1 / n + 4 * p * (n * (1 - p) + 1), 0.0))) / (2 * (n + z * z))
        high = 1.0 if successes == n else (2 * n * p + z * z + 1 + z * math.sqrt(
            max(z * z + 2 - 1 / n + 4 * p * (n * (1 - p) - 1), 0.0))) / (2 * (n + z * z))
        return max(0.0, low), min(1.0, high)
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def tango_interval(b: int, c: int, n: int, z: float = Z_95,
                   correction: float = TANGO_CORRECTION) -> tuple[float, float]:
    """Tango's (1998) score interval for q12 − q21 from n pairs, b of them (1, 0) and c (0, 1): every Δ whose
    score statistic (|b − c − nΔ| − correction)⁺ / sqrt(n(2q̂ + Δ − Δ²)) stays within z, q̂ the restricted
    maximum-likelihood estimate of q21 given Δ (`correction` 0: Tango's own). Bounds by bisection; never zero
    width for n ≥ 1."""
    def statistic(delta: float) -> float:
        a_coef = 2.0 * n
        b_coef = -b - c + (2.0 * n - b + c) * delta
        c_coef = -c * delta * (1.0 - delta)
        q21 = (math.sqrt(max(b_coef * b_coef - 4 * a_coef * c_coef, 0.0)) - b_coef) / (2 * a_coef)
        variance = n * (2 * q21 + delta - delta * delta)
        numerator = max(abs(b - c - n * delta) - correction, 0.0)
        if variance <= 0:
            return 0.0 if abs(numerator) < 1e-12 else math.inf
        return abs(numerator) / math.sqrt(variance)

    centre = (b - c) / n

    def bound(edge: float) -> float:
        inside, outside = centre, edge
        if statistic(edge) <= z:
            return edge
        for _ in range(60):
            middle = (inside + outside) / 2
            if statistic(middle) <= z:
                inside = middle
            else:
                outside = middle
        return inside

    return bound(-1.0), bound(1.0)


def mover_interval(k1: int, n1: int, k2: int, n2: int, correlation: float, z: float = Z_95,
                   continuity: bool = True) -> tuple[float, float]:
    """Newcombe's hybrid score interval for p1 − p2 (the MOVER combination of the two Wilson intervals, continuity-
    corrected: his method 11; `continuity` False: method 10) with the correlation of the two estimates (0 for
    independent samples)."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson_interval(k1, n1, z, continuity)
    l2, u2 = wilson_interval(k2, n2, z, continuity)
    d = p1 - p2
    low = d - math.sqrt(max((p1 - l1) ** 2 - 2 * correlation * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    high = d + math.sqrt(max((u1 - p1) ** 2 - 2 * correlation * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return max(-1.0, low), min(1.0, high)


def overlap_interval(k1: int, n1: int, k2: int, n2: int, shared: tuple[int, int, int, int],
                     continuity: bool = True) -> tuple[float, float]:
    """The MOVER interval for two rates whose eligible items partly coincide, with the correlation of the two
    estimates that the shared items' table (both, first only, second only, neither) gives."""
    count = sum(shared)
    correlation = _phi(*shared) * count / math.sqrt(n1 * n2) if count else 0.0
    return mover_interval(k1, n1, k2, n2, correlation, continuity=continuity)


def _phi(both: int, first_only: int, second_only: int, neither: int) -> float:
    """Newcombe's continuity-corrected phi for a paired 2×2 table (0 when a margin is empty)."""
    n = both + first_only + second_only + neither
    denominator = math.sqrt((both + first_only) * (second_only + neither) * (both + second_only)
                            * (first_only + neither))
    if denominator == 0:
        return 0.0
    cross = both * neither - first_only * second_only
    corrected = max(cross - n / 2, 0.0) if cross > 0 else cross
    return corrected / denominator


def rate_difference(success_a: np.ndarray, eligible_a: np.ndarray, success_b: np.ndarray,
                    eligible_b: np.ndarray) -> dict[str, Any]:
    """rate_a − rate_b over per-item flags (rate = successes among the eligible items of that side), with a 95%
    interval and a two-sided p-value for no difference (see the module's note for which ones)."""
    a = np.asarray(success_a, dtype=bool) & np.asarray(eligible_a, dtype=bool)
    b = np.asarray(success_b, dtype=bool) & np.asarray(eligible_b, dtype=bool)
    from scipy.stats import binomtest, fisher_exact  # here: scipy.stats takes a second to import

    ea, eb = np.asarray(eligible_a, dtype=bool), np.asarray(eligible_b, dtype=bool)
    n1, n2 = int(ea.sum()), int(eb.sum())
    if n1 == 0 or n2 == 0:
        return {"value": None, "ci": [None, None], "n": int((ea | eb).sum()), "p": None, "method": None}
    k1, k2 = int(a.sum()), int(b.sum())
    both = ea & eb
    value = k1 / n1 - k2 / n2
    if np.array_equal(ea, eb):
        first_only, second_only = int((a & ~b & both).sum()), int((~a & b & both).sum())
        low, high = tango_interval(first_only, second_only, n1)
        discordant = first_only + second_only
        p = binomtest(first_only, discordant, 0.5).pvalue if discordant else 1.0
        method = "tango-paired"
    else:
        table = (int((a & b & both).sum()), int((a & ~b & both).sum()), int((~a & b & both).sum()),
                 int((~a & ~b & both).sum()))
        low, high = overlap_interval(k1, n1, k2, n2, table)
        p = float(fisher_exact([[k1, n1 - k1], [k2, n2 - k2]])[1])
        method = "newcombe-mover"
    return {"value": round(value, 6), "ci": [round(low, 6), round(high, 6)], "n": int((ea | eb).sum()),
            "p": round(float(p), 4), "method": method}


EXACT_SIGN_FLIPS = 20  # up to this many clusters the sign-flip test enumerates every flip (2^20 sums)


def clustered_difference(success_a: np.ndarray, success_b: np.ndarray, clusters: np.ndarray,
                         flips: int = 200_000) -> dict[str, Any]:
    """rate_a − rate_b over the same items grouped in clusters (BBQ templates: items of one template succeed or
    fail together more than chance, so an item-level interval is too narrow). The interval is the cluster-robust
    (CR1) one: the items' mean difference ± t(J − 1) times the standard error from the clusters' summed
    differences; the p-value is the sign-flip test over those sums (exact up to EXACT_SIGN_FLIPS clusters, else
    `flips` seeded draws). None when there are fewer than two clusters."""
    a, b = np.asarray(success_a, dtype=float), np.asarray(success_b, dtype=float)
    keys, index = np.unique(np.asarray(clusters), return_inverse=True)
    n, count = len(a), len(keys)
    sums, sizes = np.bincount(index, a - b, count), np.bincount(index, minlength=count)
    if count < 2:
        return {"value": None, "ci": [None, None], "n": n, "clusters": count, "p": None}
    value = float(sums.sum() / n)
    from scipy.stats import t  # here: scipy.stats takes a second to import

    residuals = sums - sizes * value
    se = math.sqrt(count / (count - 1) * float(residuals @ residuals)) / n
    half = float(t.ppf(0.975, count - 1)) * se
    if count <= EXACT_SIGN_FLIPS:
        signs = 1 - 2 * ((np.arange(2**count)[:, None] >> np.arange(count)) & 1)
    else:
        signs = np.random.default_rng(0).choice([-1, 1], size=(flips, count))
    observed = abs(float(sums.sum()))
    p = float(np.mean(np.abs(signs @ sums) >= observed - 1e-9))
    return {"value": round(value, 6), "ci": [round(max(value - half, -1.0), 6), round(min(value + half, 1.0), 6)],
            "n": n, "clusters": count, "p": round(p, 4)}
