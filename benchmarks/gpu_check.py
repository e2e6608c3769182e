"""GPU check: items 1–3 of the benchmarks (scoring throughput vs the peers, prefix reuse, hardware
efficiency) in bf16 on random-weight Llama models of about 1B and 7B parameters (throughput does
not depend on the weights). Needs only torch and transformers (plus flexsearch); a byte-level BPE
tokenizer is trained on the BBQ texts on the fly.

    bash benchmarks/gpu_check.sh            # or: python -m benchmarks.gpu_check --shapes 1b 7b
"""

from __future__ import annotations

import argparse

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from benchmarks import bench_prefix, bench_scoring
from benchmarks.common import bbq_items
from flexsearch.scoring.model import TargetModel

SHAPES = {  # hidden, layers, heads, kv heads, intermediate
    "tiny": (64, 2, 4, 2, 128),  # a CPU smoke test of this script
    "1b": (2048, 16, 32, 8, 8192),
    "7b": (4096, 32, 32, 32, 11008),
}


def tokenizer() -> PreTrainedTokenizerFast:
    corpus = [f"{it.context} {it.question} {' '.join(it.answers)}" for it in bbq_items("Age", 400)]
    corpus.append("Q: Option: Answer: ( ) A B C")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=4000, special_tokens=["<pad>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>")
    fast.padding_side = "left"
    return fast


def random_llama(shape: str, tok: PreTrainedTokenizerFast, device: str, dtype: torch.dtype) -> TargetModel:
    hidden, layers, heads, kv, inter = SHAPES[shape]
    config = LlamaConfig(vocab_size=32000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=4096,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    return TargetModel(model, tok, {"model": f"random-llama-{shape}", "device": device})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="+", default=["1b", "7b"], choices=list(SHAPES))
    parser.add_argument("--batches", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--items", type=int, default=32)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tok = tokenizer()
    for shape in args.shapes:
        target = random_llama(shape, tok, device, dtype)
        params = sum(p.numel() for p in target.model.parameters()) / 1e9
        for batch in args.batches:
            bench_scoring.run(target, args.items, batch,
                              f"GPU check: scoring, {shape} ({params:.2f}B params, {dtype}), batch {batch}")
        bench_prefix.run(target, 4, 24, args.batches[-1], f"GPU check: prefix reuse, {shape}")
        del target
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
