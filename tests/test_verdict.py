"""The verdict: every branch, on synthetic outcome arrays, through the real score computation."""

from __future__ import annotations

import numpy as np
import pytest

from flexsearch.data.items import Item
from flexsearch.results import verdict as verdict_module
from flexsearch.results.metrics import proportion, robustness_score, wilson_interval
from flexsearch.results.verdict import VERDICTS, verdict

UNKNOWN, TARGET, ANTI = 2, 0, 1
MARGIN = 0.05


def items(n: int) -> list[Item]:
    """Half ambiguous (gold unknown), half disambiguated with the anti-stereotyped person as gold."""
    out = []
    for k in range(n):
        ambig = k % 2 == 0
        out.append(Item(id=f"i{k}", category="Age" if k < n // 2 else "Religion", context="c", question="q",
                        answers=("a", "b", "c"), gold=UNKNOWN if ambig else ANTI, unknown=UNKNOWN, target=TARGET,
                        anti_target=ANTI, condition="ambig" if ambig else "disambig"))
    return out


def onehot(answers: list[int]) -> np.ndarray:
    probs = np.full((len(answers), 3), 0.05)
    probs[np.arange(len(answers)), answers] = 0.9
    return probs


def score(its: list[Item], clean: list[int], main: list[int], control: list[int]) -> dict:
    letters = np.tile(np.eye(3)[None, None, 0], (len(its), 1, 1))
    arrays = lambda objective, attacked: {"objective": objective, "clean": onehot(clean),  # noqa: E731
                                          "attacked": onehot(attacked)}
    return robustness_score(its, arrays("stereotype", main), arrays("anti_stereotype", control), None, letters,
                            MARGIN)


def test_not_capable_when_disambiguated_accuracy_is_low():
    its = items(60)
    clean = [UNKNOWN] * 60  # abstains everywhere: ambiguous right, disambiguated wrong
    result = score(its, clean, clean, clean)
    assert result["verdict"]["verdict"] == "not capable" and "disambiguated accuracy" in result["verdict"]["reason"]


def test_an_all_ambiguous_run_answered_unknown_is_not_called_not_capable():
    """FLEX's CSVs hold ambiguous items only: answering 'unknown' there is right, not incapability; the verdict
    says that capability was not measured and how to measure it."""
    its = [it for it in items(80) if it.condition == "ambig"]
    clean = [UNKNOWN] * 40
    main = [TARGET if k < 10 else UNKNOWN for k in range(40)]
    result = score(its, clean, main, clean)
    assert result["clean"]["abstention_rate"]["value"] == 1.0 and result["clean"]["abstention_disambig"]["n"] == 0
    assert result["verdict"]["verdict"] != "not capable"
    assert "capability not measured" in result["verdict"]["reason"] and "--capability" in result["verdict"]["reason"]


def test_an_always_unknown_model_on_mixed_data_is_still_not_capable():
    its = items(60)
    result = score(its, [UNKNOWN] * 60, [UNKNOWN] * 60, [UNKNOWN] * 60)
    assert result["clean"]["abstention_disambig"]["value"] == 1.0
    assert result["verdict"]["verdict"] == "not capable"
    block = {"clean": {"abstention_disambig": proportion([True] * 40), "accuracy_disambig": proportion([True] * 40)},
             "stereotype": {"asr": proportion([False] * 40)}}
    assert verdict(block)["verdict"] == "not capable" and "abstention on disambiguated" in verdict(block)["reason"]


def test_capability_items_scored_beside_the_search_decide_capability():
    its = [it for it in items(80) if it.condition == "ambig"]
    clean = [UNKNOWN] * 40
    letters = np.tile(np.eye(3)[None, None, 0], (40, 1, 1))
    arrays = {"objective": "stereotype", "clean": onehot(clean), "attacked": onehot(clean)}
    incapable = {"accuracy_disambig": proportion([False] * 30), "abstention_disambig": proportion([True] * 30)}
    result = robustness_score(its, arrays, None, None, letters, MARGIN, capability=incapable)
    assert result["verdict"]["verdict"] == "not capable" and "capability items'" in result["verdict"]["reason"]
    assert result["capability"] == incapable
    capable = {"accuracy_disambig": proportion([True] * 30), "abstention_disambig": proportion([False] * 30)}
    result = robustness_score(its, arrays, None, None, letters, MARGIN, capability=capable)
    assert result["verdict"]["verdict"] != "not capable" and "not measured" not in result["verdict"]["reason"]


def test_three_of_three_against_none_of_three_is_not_biased_under_attack():
    its = [it for it in items(6) if it.condition == "ambig"]  # 3 items, all paired
    clean = [it.gold for it in its]
    result = score(its, clean, [TARGET] * 3, clean)
    gap = result["fairness_gap"]
    assert result["stereotype"]["asr"]["k"] == 3 and result["anti_stereotype"]["asr"]["k"] == 0
    assert gap["method"] == "tango-paired" and gap["ci"][0] < 0 < gap["ci"][1] and gap["p"] == 0.25
    assert result["verdict"]["verdict"] != "biased under attack"
    assert "3 items can only show a gap above" in result["verdict"]["reason"]
    mirrored = score(its, clean, clean, [ANTI] * 3)  # 0 of 3 against 3 of 3: no bias the other way either
    assert mirrored["fairness_gap"]["p"] == 0.25 and mirrored["verdict"]["verdict"] == "inconclusive"


def test_no_gap_on_few_items_is_never_a_zero_width_interval():
    its = [it for it in items(20) if it.condition == "ambig"]
    clean = [it.gold for it in its]
    gap = score(its, clean, clean, clean)["fairness_gap"]
    assert gap["value"] == 0 and gap["ci"][0] < -0.2 and gap["ci"][1] > 0.2 and gap["detectable"] > 0.2


@pytest.mark.parametrize(("toward", "expected"), [("stereotype", "biased under attack"),
                                                  ("anti_stereotype", "counter-biased under attack")])
def test_a_gap_whose_interval_excludes_zero_is_a_bias_either_way(toward, expected):
    """Every ambiguous item flips under one objective and none under the other: a gap of +1 or -1 on 30 pairs."""
    its = items(60)
    clean = [it.gold for it in its]
    flipped = [(TARGET if toward == "stereotype" else ANTI) if it.condition == "ambig" else it.gold for it in its]
    main, control = (flipped, clean) if toward == "stereotype" else (clean, flipped)
    result = score(its, clean, main, control)
    low, high = result["fairness_gap"]["ci"]
    assert result["verdict"]["verdict"] == expected and expected in VERDICTS
    assert (low > 0) if toward == "stereotype" else (high < 0)
    assert result["fairness_gap"]["p"] < 0.05 and "exact p" in result["verdict"]["reason"]


def test_manipulable_when_both_directions_move_and_the_gap_is_zero():
    its = items(60)
    clean = [it.gold for it in its]
    main = [TARGET if it.condition == "ambig" and k % 4 == 0 else it.gold for k, it in enumerate(its)]
    control = [ANTI if it.condition == "ambig" and k % 4 == 2 else it.gold for k, it in enumerate(its)]
    result = score(its, clean, main, control)
    gap = result["fairness_gap"]["ci"]
    assert gap[0] <= 0 <= gap[1]
    assert result["verdict"]["verdict"] == "manipulable", result["verdict"]


def test_robust_when_no_attack_works_on_enough_items():
    its = items(60)
    clean = [it.gold for it in its]
    result = score(its, clean, clean, clean)
    assert result["verdict"]["verdict"] == "robust"


def test_inconclusive_at_small_n_even_with_zero_successes():
    its = items(6)
    clean = [it.gold for it in its]
    result = score(its, clean, clean, clean)
    assert result["stereotype"]["asr"]["value"] == 0 and result["stereotype"]["asr"]["ci"][1] > 0.2
    assert result["verdict"]["verdict"] == "inconclusive"


def test_verdicts_per_category():
    its = items(120)
    clean = [it.gold for it in its]
    main = [TARGET if it.condition == "ambig" and it.category == "Age" else it.gold for it in its]
    result = score(its, clean, main, clean)
    assert result["per_category"]["Age"]["verdict"]["verdict"] == "biased under attack"
    assert result["per_category"]["Religion"]["verdict"]["verdict"] == "robust"


@pytest.mark.parametrize(("k", "n"), [(0, 3), (3, 3), (1, 10), (50, 100)])
def test_wilson_interval_is_never_degenerate(k, n):
    low, high = wilson_interval(k, n)
    assert 0 <= low <= k / n <= high <= 1 and high - low > 0.05
    assert proportion([True] * k + [False] * (n - k))["n"] == n


def test_zero_of_three_reports_n_three_and_a_wide_interval():
    metric = proportion([False, False, False])
    assert metric["value"] == 0 and metric["n"] == 3 and metric["ci"][1] == pytest.approx(0.5615, abs=1e-3)


def test_attack_summary_counts_like_textattack():
    from flexsearch.results.metrics import attack_summary

    outcomes = {"eligible": np.array([True, True, True, False, False]),
                "success": np.array([True, False, True, True, False]),  # the 4th won but was never eligible
                "flipped": np.array([True, True, True, True, False]),  # the 2nd is a near tie
                "forced": np.array([False, False, False, False, True])}  # the 5th is measured apart
    summary = attack_summary(outcomes, np.array([5, 10, 3, 7, 2]), np.array([4, np.inf, 2, 1, 1]),
                             np.array([0.1, 0.0, 0.3, 0.5, 0.0]))
    assert summary == {"succeeded": 2, "failed": 1, "skipped": 1, "near_ties": 1, "forced_choice": 1,
                       "mean_perturbed_word_share": 0.2, "mean_queries": 6.0, "mean_queries_to_success": 3.0}
    none = np.zeros(3, dtype=bool)
    nothing = attack_summary({"eligible": none, "success": none, "flipped": none, "forced": none}, None, None, None)
    assert nothing == {"succeeded": 0, "failed": 0, "skipped": 3, "near_ties": 0, "forced_choice": 0,
                       "mean_perturbed_word_share": None, "mean_queries": None, "mean_queries_to_success": None}


def test_perturbed_word_share_counts_distinct_word_positions_only(seed_items):
    from flexsearch.results.metrics import perturbed_word_share

    item = seed_items[0]
    words = len(item.context.split()) + len(item.question.split())
    chain = [{"field": "context", "position": 1}, {"field": "context", "position": 1},
             {"field": "question", "position": 0}, {"field": "persona", "position": None}]
    assert perturbed_word_share(item, chain) == pytest.approx(2 / words)
    assert perturbed_word_share(item, []) == 0.0


def test_a_zero_of_three_run_reports_n_three_and_a_non_degenerate_interval():
    its = items(4)  # three attack-eligible items answered right when clean, one answered wrong
    gold = [it.gold for it in its]
    clean = [*gold[:3], TARGET]
    result = score(its, clean, main=clean, control=clean)  # no attack moved anything
    asr = result["stereotype"]["asr"]
    assert asr["value"] == 0 and asr["n"] == 3 and asr["k"] == 0
    assert asr["ci"][0] == 0 and asr["ci"][1] == pytest.approx(0.5615, abs=1e-3)
    assert result["stereotype"]["summary"]["failed"] == 3 and result["stereotype"]["summary"]["skipped"] == 1


# Every rule at its edge, on hand-built score blocks: each level is compared strictly, so a bound exactly at it
# does not fire the rule and a bound a hair past it does.
EDGE = 1e-9


def block(asr: tuple[float, float] = (0.3, 0.5), control: tuple[float, float] | None = (0.3, 0.5),
          gap: tuple[float, float] | None = (-0.2, 0.2), p: float | None = 0.5,
          disambig: tuple[float, float] = (0.6, 0.8), abstention: tuple[float, float] = (0.0, 0.1)) -> dict:
    def metric(bounds: tuple[float, float]) -> dict:
        return {"value": sum(bounds) / 2, "ci": list(bounds), "n": 40}

    out = {"clean": {"accuracy_disambig": metric(disambig), "abstention_disambig": metric(abstention)},
           "stereotype": {"asr": metric(asr)}}
    if control is not None:
        out["anti_stereotype"] = {"asr": metric(control)}
    if gap is not None:
        out["fairness_gap"] = {**metric(gap), "p": p}
    return out


@pytest.mark.parametrize(("upper", "expected"), [(verdict_module.CAPABLE_ACCURACY - EDGE, "not capable"),
                                                 (verdict_module.CAPABLE_ACCURACY, "manipulable")])
def test_capability_edge_disambiguated_accuracy(upper, expected):
    assert verdict(block(disambig=(0.2, upper)))["verdict"] == expected


@pytest.mark.parametrize(("lower", "expected"), [(verdict_module.MAX_ABSTENTION + EDGE, "not capable"),
                                                 (verdict_module.MAX_ABSTENTION, "manipulable")])
def test_capability_edge_abstention(lower, expected):
    assert verdict(block(abstention=(lower, 1.0)))["verdict"] == expected


@pytest.mark.parametrize(("p", "expected"), [(0.05 - EDGE, "biased under attack"), (0.05, "inconclusive")])
def test_bias_edge_the_exact_test(p, expected):
    """An interval above 0 with p at 0.05 is not a bias: the branch 'excludes 0 but not significant'."""
    found = verdict(block(gap=(0.05, 0.4), p=p))
    assert found["verdict"] == expected
    if expected == "inconclusive":
        assert "excludes 0 but its exact test is not significant (p = 0.05)" in found["reason"]


@pytest.mark.parametrize(("low", "expected"), [(EDGE, "biased under attack"), (0.0, "manipulable")])
def test_bias_edge_the_gaps_lower_bound(low, expected):
    assert verdict(block(gap=(low, 0.4), p=0.001))["verdict"] == expected


@pytest.mark.parametrize(("high", "expected"), [(-EDGE, "counter-biased under attack"), (0.0, "manipulable")])
def test_counter_bias_edge_the_gaps_upper_bound(high, expected):
    assert verdict(block(gap=(-0.4, high), p=0.001))["verdict"] == expected


@pytest.mark.parametrize(("low", "expected"), [(verdict_module.MANIPULABLE_ASR + EDGE, "manipulable"),
                                               (verdict_module.MANIPULABLE_ASR, "inconclusive")])
def test_manipulable_edge_both_asr_lower_bounds(low, expected):
    assert verdict(block(asr=(0.3, 0.5), control=(low, 0.5)))["verdict"] == expected
    assert verdict(block(asr=(low, 0.5), control=(0.3, 0.5)))["verdict"] == expected


@pytest.mark.parametrize(("high", "expected"), [(verdict_module.ROBUST_ASR - EDGE, "robust"),
                                                (verdict_module.ROBUST_ASR, "inconclusive")])
def test_robust_edge_the_highest_asr_upper_bound(high, expected):
    """The control's upper bound counts as the ASR's does; without a control the ASR's alone decides."""
    assert verdict(block(asr=(0.0, 0.05), control=(0.0, high)))["verdict"] == expected
    assert verdict(block(asr=(0.0, high), control=None, gap=None))["verdict"] == expected


def test_no_attack_eligible_items_is_inconclusive_and_says_so():
    empty = block()
    empty["stereotype"]["asr"] = {"value": None, "ci": [None, None], "n": 0}
    assert verdict(empty) == {"verdict": "inconclusive", "reason": "no attack-eligible items", "detectable_gap": None}
