"""The run-level learner: its update rule, the proposal order it gives, the prior (--prior) and what a run writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from flexsearch.cli import app
from flexsearch.config import load_config
from flexsearch.engine.learner import COMPOSE, Learner, Observation, composition_of, read_prior, rebuilt
from flexsearch.engine.loop import build_context, proposable_arms
from flexsearch.engine.methods.learned import Learned
from flexsearch.engine.state import ItemState, item_rng
from flexsearch.errors import FlexsearchError
from flexsearch.results.weak_spots import weak_spots
from flexsearch.scoring.scorer import Scorer

runner = CliRunner()
SETTINGS = ["constraints=[protected_spans, unique_positions, polarity_guard]",
            "operators=[{name: persona, n: 2}, {name: instruction, n: 2}, "
            "{name: textbugger, bugs: [insert, delete, swap, sub_c], positions: 1, per_position: 2}]"]
FAST = [part for setting in SETTINGS for part in ("--set", setting)]


def test_an_observation_teaches_its_arm_family_and_operator_and_a_composition_its_lift():
    learner = Learner()
    learner.observe(Observation("persona/role_play/1", "instruction/fake_majority/0+persona/role_play/1",
                                gain=0.5, lift=1.5, success=True, valid=True))
    for arm in ("persona/role_play/1", "persona/role_play", "persona"):
        assert learner.arms[arm].tries == 1 and learner.arms[arm].gain_sum == 0.5 and learner.arms[arm].wins == 1
    composition = f"{COMPOSE}:instruction/fake_majority/0+persona/role_play/1"
    assert learner.arms[composition].gain_sum == 1.5
    # A template never tried takes its family's mean, shrunk toward the operator's; unknown families the operator's.
    assert learner.mean("persona/role_play/3") == pytest.approx(learner.mean("persona/role_play"))
    assert 0 < learner.mean("persona/authority/0") < learner.mean("persona/role_play/1")
    assert learner.mean("textbugger") == 0.0
    # A forced-choice (not label-valid) composition teaches its arm but no composition.
    learner.observe(Observation("instruction/option_exclusion/0", "instruction/option_exclusion/0+persona/authority/3",
                                gain=2.0, lift=2.0, success=True, valid=False))
    assert f"{COMPOSE}:instruction/option_exclusion/0+persona/authority/3" not in learner.arms
    assert Learner.from_dict(json.loads(json.dumps(learner.to_dict()))) == learner


def test_a_template_swapped_in_for_another_learns_its_own_effect_not_the_difference():
    learner = Learner()
    for _ in range(8):  # the leader, added to clean prompts, gains 0.6 each time
        learner.observe(Observation("instruction/fictional_framing/0", "instruction/fictional_framing/0", 0.6, 0.6,
                                    False, True))
    leader = learner.mean("instruction/fictional_framing/0")
    # Swapped in for the leader, a template that does as well gains nothing over it: it learns the leader's effect.
    swap = Observation("instruction/fake_majority/0", "instruction/fake_majority/0", 0.0, 0.6, False, True,
                       replaced="instruction/fictional_framing/0")
    learner.observe(swap)
    assert learner.arms["instruction/fake_majority/0"].gain_sum == pytest.approx(leader)
    # Without the template it replaced, the same gain would have taught it nothing.
    bare = Learner()
    bare.observe(Observation("instruction/fake_majority/0", "instruction/fake_majority/0", 0.0, 0.6, False, True))
    assert bare.arms["instruction/fake_majority/0"].gain_sum == 0.0
    # The trace keeps what was replaced; a trace written before it was kept reads as replacing nothing.
    assert Observation.from_list(json.loads(json.dumps(swap.to_list()))) == swap
    assert Observation.from_list(swap.to_list()[:6]).replaced == ""


def test_a_learned_draw_favours_what_paid_and_still_explores():
    learner = Learner()
    for _ in range(20):
        learner.observe(Observation("instruction/fictional_framing/1", "instruction/fictional_framing/1", 1.0, 1.0,
                                    False, True))
        learner.observe(Observation("textbugger", "", -0.05, -0.05, False, True))
    rng = np.random.default_rng(0)
    spread = learner.spread()
    draws = [(learner.draw("instruction/fictional_framing/1", rng, spread), learner.draw("textbugger", rng, spread),
              learner.draw("persona/comedian/0", rng, spread)) for _ in range(400)]
    good, words, untried = np.array(draws).T
    assert (good > words).mean() > 0.95
    assert untried.std() > words.std()  # an arm never tried is drawn widely: it keeps a chance


def first_proposals(ctx, item, learner: Learner) -> list[str]:
    """The composition of each candidate the learned search scores first after the clean prompt."""
    state = ItemState(item, ctx.objective, item_rng(0, item.id, "stereotype"), 60, ctx.scorer.queries_per_candidate,
                      learner=learner.copy())
    method = Learned.search(ctx, state)
    root = next(method)
    probs = ctx.scorer.score(root.candidates).probs
    state.record(root, probs)
    request = method.send(probs)
    return [composition_of(c) for c in request.candidates]


def test_a_prior_changes_the_proposal_order(tiny_target, seed_items):
    config = load_config("default", SETTINGS, control=False)
    ctx = build_context(config, Scorer.in_process(tiny_target), "stereotype")
    item = seed_items[0]
    cold = first_proposals(ctx, item, Learner())
    primed = Learner()
    for _ in range(30):  # on earlier items one template paid well, the rest of the library did not
        primed.observe(Observation("persona/comedian/0", "persona/comedian/0", 2.0, 2.0, True, True))
        for arm in sorted(proposable_arms(config) - {"persona/comedian/0"}):
            primed.observe(Observation(arm, arm if "/" in arm else "", -0.5, -0.5, False, True))
    warm = first_proposals(ctx, item, primed)
    assert warm[0] == "persona/comedian/0" and cold[0] != "persona/comedian/0"
    assert warm != cold


def search(tiny_model_dir: Path, out: Path, *extra: str) -> CliRunner:
    return runner.invoke(app, ["search", "--model", str(tiny_model_dir), "--data", "seed", "--limit", "8",
                               "--budget", "15", "--out", str(out), *FAST, "--set", "learner_round=4", *extra])


def test_a_run_writes_its_learner_and_weak_spots_and_a_prior_warm_starts_another(tiny_model_dir, tmp_path):
    first = search(tiny_model_dir, tmp_path / "first")
    assert first.exit_code == 0, first.output
    state = json.loads((tmp_path / "first" / "learner.json").read_text())
    trace = [json.loads(x) for x in (tmp_path / "first" / "trace.jsonl").read_text().splitlines()]
    for objective in ("stereotype", "anti_stereotype"):
        records = [r for r in trace if r["objective"] == objective]
        # every item scored attacked candidates, but one whose clean prompt was already at the aim (it stops there)
        assert all(r["observations"] or (r["success"] and r["queries"] == 3) for r in records)
        assert any(r["observations"] for r in records)
        assert state["objectives"][objective]["items"] == 8
        assert Learner.from_dict(state["objectives"][objective]) == rebuilt(None, records)
        # a template swapped in names the one whose slot it took (the same operator's: persona for persona)
        swaps = [o for r in records for o in map(Observation.from_list, r["observations"]) if o.replaced]
        assert swaps and all({a.split("/")[0] for a in o.replaced.split("+")} <= {a.split("/")[0]
                                                                                  for a in o.arm.split("+")}
                             for o in swaps)
    score = json.loads((tmp_path / "first" / "score.json").read_text())
    spots = score["weak_spots"]
    assert spots["overall"] and all({"key", "kind", "broke"} <= set(s) for s in spots["overall"])
    ks = [s["broke"]["k"] for s in spots["overall"]]
    assert ks == sorted(ks, reverse=True)
    assert "weak spots" in first.output and "learner.json" in (tmp_path / "first" / "README.md").read_text()

    second = search(tiny_model_dir, tmp_path / "second", "--prior", str(tmp_path / "first"), "--seed", "1")
    assert second.exit_code == 0, second.output
    score = json.loads((tmp_path / "second" / "score.json").read_text())
    config = (tmp_path / "second" / "config.yaml").read_text()
    assert score["prior"]["run"] == str(tmp_path / "first") and score["prior"]["items"]["stereotype"] == 8
    assert score["prior"]["learner_sha256"] in config
    warm = json.loads((tmp_path / "second" / "learner.json").read_text())
    assert warm["objectives"]["stereotype"]["items"] == 16  # the prior's 8 items, then this run's 8
    # the prior's queries are not this run's: every item stays within this run's budget
    assert all(r["queries"] <= 15 for r in map(json.loads, (tmp_path / "second" / "trace.jsonl").open()))


def write_learner(folder: Path, objectives: dict) -> Path:
    folder.mkdir()
    (folder / "learner.json").write_text(json.dumps({"schema": 1, "objectives": objectives}))
    return folder


@pytest.mark.parametrize(("objectives", "message"), [
    ({"untargeted": {"arms": {"persona/role_play/0": [3, 1, 1.0, 1.0]}}}, "another objective scheme"),
    ({"stereotype": {"arms": {"instruction/option_exclusion/0": [5, 2, 3.0, 4.0]}},
      "anti_stereotype": {"arms": {"instruction/option_exclusion/1": [5, 2, 3.0, 4.0]}}},
     "holds no arm this search can propose (a forced-choice-only run"),
    ({"stereotype": {"arms": []}, "anti_stereotype": {"arms": []}}, "malformed learner state"),
])
def test_an_incompatible_prior_is_refused_in_one_line(tiny_model_dir, tmp_path, objectives, message):
    prior = write_learner(tmp_path / "prior", objectives)
    result = search(tiny_model_dir, tmp_path / "out", "--prior", str(prior))
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_folder_without_a_learner_is_no_prior(tmp_path):
    config = load_config("default", SETTINGS)
    with pytest.raises(FlexsearchError, match=re.escape("no learner.json")):
        read_prior(tmp_path, ["stereotype"], proposable_arms(config))
    with pytest.raises(FlexsearchError, match="not a run folder"):
        read_prior(tmp_path / "missing", ["stereotype"], proposable_arms(config))


def test_weak_spots_count_items_not_candidates_and_only_eligible_label_valid_ones():
    def record(*observations: tuple[str, bool, bool]) -> dict:
        return {"observations": [[c.split("+")[-1], c, 0.1, 0.1, won, valid] for c, won, valid in observations]}

    pair = "instruction/fake_majority/0+persona/role_play/1"
    records = [record((pair, True, True), (pair, True, True)),  # broke item 1 (twice: one item)
               record((pair, False, True), ("persona/role_play/1", False, True)),
               record((pair, True, True)),  # not eligible: not counted
               record(("instruction/option_exclusion/0", True, False))]  # forced choice: not counted
    spots = weak_spots(records, [True, True, False, True], ["Age", "Age", "Age", "Religion"])
    by_key = {s["key"]: s["broke"] for s in spots["overall"]}
    assert by_key[pair]["k"] == 1 and by_key[pair]["n"] == 2
    assert by_key["persona/role_play/1"]["n"] == 2 and "instruction/option_exclusion/0" not in by_key
    assert spots["per_category"]["Religion"] == [] and spots["items"] == 3


def test_weak_spots_map_each_family_to_what_broke_it():
    def observation(arm: str, composition: str, won: bool, family: str) -> list:
        return [arm, composition, 0.1, 0.1, won, True, "", family]

    records = [{"observations": [observation("persona/role_play/1", "persona/role_play/1", True, "persona"),
                                 observation("textbugger", "", False, "text")]},
               {"observations": [observation("textbugger", "", True, "text"),
                                 observation("textbugger", "persona/role_play/1", True, "composition")]},
               {"observations": [observation("instruction/fake_majority/0", "instruction/fake_majority/0", False,
                                             "instruction")]}]
    spots = weak_spots(records, [True, True, True], ["Age", "Religion", "Age"])["per_family"]
    assert {s["key"]: (s["broke"]["k"], s["broke"]["n"]) for s in spots["text"]["overall"]} == {"textbugger": (1, 2)}
    assert spots["text"]["items"] == 2 and set(spots["text"]["per_category"]) == {"Age", "Religion"}
    assert {s["key"] for s in spots["composition"]["overall"]} == {"persona/role_play/1", "textbugger"}
    assert spots["persona"]["overall"][0]["broke"]["k"] == 1 and spots["persona"]["items"] == 1
    assert spots["instruction"]["overall"][0]["broke"]["k"] == 0
    assert Observation.from_list(observation("textbugger", "", True, "text")).family == "text"
    assert Observation.from_list(observation("textbugger", "", True, "text")[:7]).family == ""  # an older trace
