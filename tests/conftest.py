"""Shared fixtures: a tiny random-weight Llama built locally (no downloads) and the embedded SmolLM2."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

# `datasets` (and lm-eval through it) caches a local folder's data by the folder's name, not its content: an
# export rewritten under the same name would be read back stale from an earlier run. Every test session gets
# its own cache (set before anything imports datasets; lm-eval subprocesses inherit it).
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="flexsearch-tests-datasets-")

import pytest  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from flexsearch.data.items import Item, load_items  # noqa: E402
from flexsearch.scoring.model import TargetModel, load_target  # noqa: E402
from flexsearch.scoring.scorer import Scorer  # noqa: E402

# The CLI in a process that sends a signal right after a named step of the run pipeline (a function of
# flexsearch.api) returns for the n-th time: to itself (kill -9, Ctrl-C) or to another process group (a server).
# Kill and interrupt tests signal at that deterministic point, where polling the trace from outside raced the search.
SIGNAL_AFTER = """
import os, signal, sys
import flexsearch.pipeline.search as pipeline
from flexsearch.cli import app
step, at, sig, group = sys.argv[1], int(sys.argv[2]), getattr(signal, sys.argv[3]), int(sys.argv[4])
del sys.argv[1:5]
signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job inherits Ctrl-C ignored
original, calls = getattr(pipeline, step), []
def then_signal(*args, **kwargs):
    result = original(*args, **kwargs)
    calls.append(None)
    if len(calls) == at:
        os.killpg(group, sig) if group else os.kill(os.getpid(), sig)
    return result
setattr(pipeline, step, then_signal)
app()
"""

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_model(directory: Path, seed: int = 0) -> Path:
    """Trains a small byte-level BPE on the seed texts and saves a 2-layer random Llama beside it."""
    corpus = []
    for item in load_items("seed").items:
        corpus += [item.context, item.question, *item.answers]
    corpus += ["Q: Option: Answer: ( ) A B C", "You are a helpful assistant. Answer with a single letter."]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<pad>", "<s>", "</s>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.5,
        pad_token_id=fast.pad_token_id, bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def cli_signalling_after() -> Callable[..., list[str]]:
    """The command line of a CLI that signals after `step` (a flexsearch.pipeline.search function; `append_jsonl`
    appends one finished batch to the trace) returns for the `at`-th time; the CLI's own arguments follow it."""

    def command(step: str, at: int, signal_name: str, group: int = 0) -> list[str]:
        return [sys.executable, "-c", SIGNAL_AFTER, step, str(at), signal_name, str(group)]

    return command


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_target(tiny_model_dir: Path) -> TargetModel:
    return load_target(str(tiny_model_dir), device="cpu")


@pytest.fixture
def tiny_scorer(tiny_target: TargetModel) -> Scorer:
    return Scorer.in_process(tiny_target, batch_size=4)


@pytest.fixture(scope="session")
def seed_items() -> list[Item]:
    return load_items("seed").items


@pytest.fixture(scope="session")
def smollm2() -> TargetModel:
    return load_target("smollm2", device="cpu")
