"""Differences of rates (flexsearch/results/differences.py): intervals that hold at small n, and their tests."""

from __future__ import annotations

import numpy as np
import pytest

from flexsearch.results.differences import (
    clustered_difference,
    mover_interval,
    overlap_interval,
    rate_difference,
    tango_interval,
)


# Newcombe (1998), "Interval estimation for the difference between independent proportions: comparison of eleven
# methods", Statistics in Medicine 17:873-890, Table II, methods 10 (the hybrid score interval) and 11 (its
# continuity-corrected form, what the MOVER path uses): an independent reference for the MOVER path with no
# correlation, the one every mixed ambiguous/disambiguated run takes.
@pytest.mark.parametrize(("k1", "n1", "k2", "n2", "low", "high"), [
    (56, 70, 48, 80, 0.0524, 0.3339), (9, 10, 3, 10, 0.1705, 0.8090), (5, 56, 0, 29, -0.0381, 0.1926),
    (0, 10, 0, 20, -0.1611, 0.2775), (0, 10, 0, 10, -0.2775, 0.2775), (10, 10, 0, 20, 0.6791, 1.0),
    (10, 10, 0, 10, 0.6075, 1.0)])
def test_the_mover_interval_matches_newcombes_published_examples(k1, n1, k2, n2, low, high):
    assert mover_interval(k1, n1, k2, n2, 0.0, continuity=False) == pytest.approx((low, high), abs=5e-5)


def test_the_corrected_mover_interval_matches_newcombes_method_11():
    assert mover_interval(56, 70, 48, 80, 0.0) == pytest.approx((0.0428, 0.3422), abs=5e-5)


# Newcombe (1998), "Improved confidence intervals for the difference between binomial proportions based on paired
# data", Statistics in Medicine 17:2635-2650, method 10 (the two Wilson intervals squared and added with his
# corrected phi): the values published for the airway hyper-responsiveness table (Bentur et al. 2009) in Fagerland,
# Lydersen & Laake (2014), Statistics in Medicine 33:2850-2875, -0.5069 to -0.0256, and for the complete-response
# table (Cavo et al. 2012) in the contingencytables R package's checks, -0.1186 to -0.0046. An independent reference
# for the MOVER path with correlated sides (every item shared: its correlation is the table's phi).
@pytest.mark.parametrize(("table", "low", "high"), [((1, 1, 7, 12), -0.5069, -0.0256),
                                                    ((59, 6, 16, 80), -0.1186, -0.0046)])
def test_the_mover_interval_on_shared_items_matches_newcombes_paired_method_10(table, low, high):
    both, first_only, second_only, neither = table
    n = sum(table)
    interval = overlap_interval(both + first_only, n, both + second_only, n, table, continuity=False)
    assert interval == pytest.approx((low, high), abs=5e-5)


# Tango (1998), "Equivalence test and confidence interval for the difference in proportions for the paired-sample
# design", Statistics in Medicine 17:891-908: his asymptotic score interval (no correction) for the airway
# hyper-responsiveness table (Bentur et al. 2009: 1 both, 1 before only, 7 after only, 12 neither) as published in
# Fagerland, Lydersen & Laake (2014), Statistics in Medicine 33:2850-2875, Table V: -0.517 to -0.026 (three
# decimals). An independent reference for the Tango path, the one every all-ambiguous run takes.
def test_the_tango_interval_matches_its_published_value_for_the_airway_table():
    assert tango_interval(1, 7, 21, correction=0) == pytest.approx((-0.517, -0.026), abs=5e-4)
    low, high = tango_interval(7, 1, 21, correction=0)  # the sides swapped: the interval mirrored
    assert (low, high) == pytest.approx((0.026, 0.517), abs=5e-4)


@pytest.mark.parametrize(("b", "c", "n"), [(0, 0, 1), (0, 0, 3), (0, 0, 10), (3, 0, 3), (0, 3, 3), (5, 5, 100),
                                           (30, 0, 30), (0, 0, 1000)])
def test_a_paired_interval_is_never_of_zero_width_and_holds_the_estimate(b, c, n):
    low, high = tango_interval(b, c, n)
    assert -1 <= low <= (b - c) / n <= high <= 1 and high - low > 0.001


def test_three_of_three_against_none_is_not_a_certain_gap():
    flags, none, every = np.ones(3, bool), np.zeros(3, bool), np.ones(3, bool)
    gap = rate_difference(flags, every, none, every)
    assert gap["value"] == 1.0 and gap["ci"][0] < 0 and gap["p"] == 0.25 and gap["method"] == "tango-paired"


def test_none_of_two_against_none_of_two_is_no_evidence_either_way():
    none, every, neither = np.zeros(4, bool), np.ones(4, bool), np.zeros(4, bool)
    first, second = np.array([True, True, False, False]), np.array([False, False, True, True])
    paired = rate_difference(none[:2], every[:2], none[:2], every[:2])  # the same two items on both sides
    disjoint = rate_difference(none, first, neither, second)  # two items each, none shared
    z = 1.959964
    corrected_upper = (z * z + 1 + z * (z * z + 1.5) ** 0.5) / (2 * (2 + z * z))  # continuity-corrected Wilson, 0/2
    assert disjoint["ci"] == pytest.approx([-corrected_upper, corrected_upper], abs=1e-4)  # 0.8021 either way
    plain = tango_interval(0, 0, 2, correction=0)  # ±0.6576, the plain Wilson limit of 0/2
    assert paired["ci"][0] == -paired["ci"][1] and paired["ci"][1] > plain[1]  # wider than uncorrected
    for gap, method in ((paired, "tango-paired"), (disjoint, "newcombe-mover")):
        assert gap["value"] == 0 and gap["p"] == 1.0 and gap["method"] == method


def test_no_successes_either_way_on_ten_items_is_wide():
    none, every = np.zeros(10, bool), np.ones(10, bool)
    gap = rate_difference(none, every, none, every)
    assert gap["ci"] == pytest.approx(list(tango_interval(0, 0, 10)), abs=1e-6) and gap["p"] == 1.0
    assert gap["ci"][1] > 0.2775  # wider than Tango's own (the plain Wilson limit of 0/10): continuity-corrected


def test_disjoint_eligible_sets_use_the_unpaired_interval_and_fishers_test():
    success_a = np.array([1, 1, 1, 0, 0, 0], bool)
    eligible_a = np.array([1, 1, 1, 0, 0, 0], bool)
    eligible_b = ~eligible_a
    gap = rate_difference(success_a, eligible_a, np.zeros(6, bool), eligible_b)
    assert gap["method"] == "newcombe-mover" and gap["p"] == 0.1  # Fisher's exact, 3/3 against 0/3
    assert gap["ci"] == pytest.approx(list(mover_interval(3, 3, 0, 3, 0.0)), abs=1e-6)


def test_positive_correlation_narrows_the_mover_interval():
    independent = mover_interval(12, 30, 6, 30, 0.0)
    correlated = mover_interval(12, 30, 6, 30, 0.6)
    assert correlated[1] - correlated[0] < independent[1] - independent[0]


def test_mcnemar_p_value_counts_only_the_discordant_items():
    a = np.array([1] * 8 + [0] * 2 + [1] * 20, bool)  # 8 only-a, 2 only-b, 20 both
    b = np.array([0] * 8 + [1] * 2 + [1] * 20, bool)
    every = np.ones(30, bool)
    assert rate_difference(a, every, b, every)["p"] == pytest.approx(0.1094, abs=1e-3)  # binomial 8 of 10


# Exact coverage (benchmarks/bench_intervals.py): every outcome table weighed by its probability, so the
# bar of 0.93 is met or missed with no simulation error. A smaller grid than the benchmark's, with its worst cells.
GRID_SIZES = (2, 3, 5, 10, 30)
GRID_RATES = (0.05, 0.5, 0.95)


@pytest.mark.parametrize(("method", "sizes"), [
    ("Tango, corrected (used)", GRID_SIZES), ("MOVER, corrected (used)", GRID_SIZES),
    # the MOVER path as a mixed run takes it: half the items shared by both rates, correlation -0.5 to 0.9 (n = 30
    # takes two minutes here; the benchmark's table has it)
    ("MOVER, half shared, corrected (used)", GRID_SIZES[:-1])])
def test_every_cell_of_the_grid_covers_at_least_093_exactly_and_the_width_stays_bounded(method, sizes):
    from benchmarks.bench_intervals import exact_grid

    used = exact_grid(method, sizes, GRID_RATES)
    plain = exact_grid(method.replace("corrected (used)", "uncorrected"), sizes, GRID_RATES)
    assert all(coverage >= 0.93 for coverage, _ in used.values()), used
    assert all(width <= 1.25 * plain[n][1] for n, (_, width) in used.items())  # a quarter wider at most
    assert min(coverage for coverage, _ in plain.values()) < 0.93  # the bar can fail: the uncorrected one fails it


def test_the_retired_percentile_bootstrap_fails_the_same_bar():
    from benchmarks.bench_intervals import exact_grid

    assert exact_grid("bootstrap", (3,), GRID_RATES)[3][0] < 0.93


def test_the_clustered_difference_matches_its_hand_computed_interval_and_exact_sign_flip_p():
    """Four templates with summed differences 2, 1, 0, -1 over 2, 3, 1, 1 items: mean 2/7; CR1 standard error
    sqrt(4/3 · 186/49) / 7 = 0.32139 with t(3) = 3.18245 gives 0.2857 ± 1.0228; of the 16 sign flips of (2, 1, 0, -1),
    12 reach |sum| >= 2."""
    a = np.array([1, 1, 1, 0, 0, 0, 0], bool)
    b = np.array([0, 0, 0, 0, 0, 0, 1], bool)
    found = clustered_difference(a, b, np.array(["A", "A", "B", "B", "B", "C", "D"]))
    assert found["value"] == pytest.approx(2 / 7, abs=1e-6)
    assert found["ci"] == pytest.approx([2 / 7 - 1.022801, 1.0], abs=1e-5)  # the upper end clipped at 1
    assert (found["p"], found["clusters"], found["n"]) == (0.75, 4, 7)


def test_one_template_gives_no_clustered_interval_and_many_templates_are_sampled():
    one = clustered_difference(np.ones(5, bool), np.zeros(5, bool), np.zeros(5))
    assert one["value"] is None and one["ci"] == [None, None]
    many = clustered_difference(np.ones(44, bool), np.zeros(44, bool), np.arange(44) % 22)  # 2^22 flips: sampled
    assert many["p"] < 1e-4  # exactly 2 of 2^22 flips reach the observed sum


def test_items_of_one_template_move_together_and_only_the_clustered_interval_covers():
    """12 templates of 6 items; on half of them (drawn) the first method gains 0.6: the true difference is 0.3 but
    items are not independent. Seeded simulation: the cluster-robust interval covers at least 0.93, the item-level
    Tango interval, too narrow for clustered items, falls short of 0.9."""
    rng = np.random.default_rng(1)
    templates, every = np.repeat(np.arange(12), 6), np.ones(72, bool)
    clustered = item_level = 0
    for _ in range(400):
        a = rng.random(72) < np.repeat(0.2 + rng.choice([0.0, 0.6], size=12), 6)
        b = rng.random(72) < 0.2
        low, high = clustered_difference(a, b, templates)["ci"]
        clustered += low <= 0.3 <= high
        low, high = rate_difference(a, every, b, every)["ci"]
        item_level += low <= 0.3 <= high
    assert clustered / 400 >= 0.93 and item_level / 400 < 0.9
