"""Shared fixtures: a tiny random-weight Llama built locally (no downloads) and the embedded SmolLM2."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# `datasets` (and lm-eval through it) caches a local folder's data by the folder's name, not its content: an
# export rewritten under the same name would be read back stale from an earlier run. Every test session gets
# its own cache (set before anything imports datasets; lm-eval subprocesses inherit it).
os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="flexsearch-tests-datasets-")

import pytest  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

from flexsearch.items import Item, load_items  # noqa: E402
from flexsearch.model import TargetModel, load_target  # noqa: E402
from flexsearch.scoring import Scorer  # noqa: E402

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
