"""The shipped calibration zoo on the real embedded Gemma-3-270M (slow): every alias loads and scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flexsearch.data.candidate import Candidate
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.model import ZOO_ALIASES, load_target, zoo_adapter
from flexsearch.scoring.scorer import Scorer
from flexsearch.zoo.finetune import read_recipe

pytestmark = pytest.mark.slow
POLICY = {"gemma3-bbq": "gold", "gemma3-bbq-fair": "fair", "gemma3-bbq-planted": "planted",
          "gemma3-bbq-manipulable": "manipulable", "gemma3-bbq-abstainer": "abstainer"}


@pytest.mark.parametrize("alias", list(ZOO_ALIASES))
def test_zoo_alias_loads_its_adapter_and_scores(alias, seed_items):
    target = load_target(alias, device="cpu")
    assert target.info["model"] == alias and target.info["base_model"] == "gemma3"
    adapter = Path(target.info["adapter"])
    recipe = read_recipe(adapter)
    assert recipe["policy"] == POLICY[alias]
    assert recipe["base_model"]["gguf_sha256"] == target.info["gguf_sha256"]
    assert recipe["total_wall_time_s"] <= 30 * 60  # the training budget per adapter
    assert (adapter / "adapter_model.safetensors").stat().st_size < 16 * 2**20
    scores = Scorer.in_process(target, average_orders=True).score([Candidate.root(it) for it in seed_items[:6]])
    assert np.allclose(scores.probs.sum(-1), 1)
    if alias == "gemma3-bbq-abstainer":
        unknown = [it.unknown for it in seed_items[:6]]
        assert (scores.probs.argmax(-1) == unknown).sum() >= 5


def test_every_zoo_adapter_holds_out_the_same_templates():
    splits = [read_recipe(zoo_adapter(alias))["split"] for alias in ZOO_ALIASES]
    assert all(s["eval_templates"] == splits[0]["eval_templates"] for s in splits)
    assert len(splits[0]["eval_item_ids"]) > 1000


def test_a_zoo_adapter_is_refused_on_another_base_model():
    with pytest.raises(FlexsearchError, match="trained on another base model"):
        load_target("smollm2", adapter=str(zoo_adapter("gemma3-bbq")), device="cpu")
