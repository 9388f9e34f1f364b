"""Tiny random-initialised targets of every supported architecture, built offline.

`build_tiny_target(folder, arch)` writes a model folder (config, random weights, a small
BPE tokenizer with a ChatML template) that loads like any Hugging Face checkpoint: hidden
size 32, 8 layers, about 360 tokens. Its outputs mean nothing; it exercises the whole
pipeline (training, checkpoints, serving, decoding) in seconds on a CPU, which the tests
and the benchmarks' dry runs rely on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Natalia sold 48 clips in April and half as many in May. How many in total? 72",
    "user assistant system: please write a function that sorts a list of numbers.",
    "import os\nfor i in range(10):\n    print(i * i)\n",
] * 4
ARCHITECTURES = [
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "GptOssForCausalLM",
    "Qwen3NextForCausalLM",
]
COMMON: dict[str, Any] = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                              max_position_embeddings=512)
#: what an architecture's config adds to COMMON (its experts, its layer kinds)
EXTRA: dict[str, dict[str, Any]] = {
    "Qwen3MoeForCausalLM": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "GptOssForCausalLM": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
                              layer_types=["sliding_attention", "full_attention"] * 4),
    "Qwen3NextForCausalLM": dict(linear_num_key_heads=2, linear_num_value_heads=4,
                                 linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
                                 num_experts_per_tok=2, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=32, full_attention_interval=4),
}


def build_tokenizer(folder: Path) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    return fast


def arch_config(arch: str, vocab: int, ids: dict[str, int]) -> Any:
    import transformers

    cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    config = cls(vocab_size=vocab, **COMMON, **EXTRA.get(arch, {}), **ids)
    config.architectures = [arch]
    return config


def build_tiny_target(folder: Path, arch: str, seed: int = 0) -> Path:
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    ids = dict(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(arch_config(arch, len(tok), ids))
    model.save_pretrained(folder)
    GenerationConfig(**ids).save_pretrained(folder)
    return folder
