"""Real targets described by config.json alone, for memory plans without weights: the
fields of each model's published config.json and the `metadata.total_size` of its
safetensors index (bytes in bfloat16). `write_shape` writes such a folder: config.json plus
an index whose shards do not exist (nothing reads weights to plan)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
          "torch_dtype": "bfloat16", "vocab_size": 128256,
          "max_position_embeddings": 131072, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
          "hidden_act": "silu", "tie_word_embeddings": False}
_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
          "torch_dtype": "bfloat16", "vocab_size": 152064, "max_position_embeddings": 32768,
          "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "hidden_act": "silu",
          "tie_word_embeddings": False}

#: name -> (config.json, index metadata.total_size)
SHAPES: dict[str, tuple[dict[str, Any], int]] = {
    "Llama-3.1-8B": ({**_LLAMA, "num_hidden_layers": 32, "hidden_size": 4096,
                      "num_attention_heads": 32, "num_key_value_heads": 8,
                      "intermediate_size": 14336}, 16_060_522_496),
    "Qwen2.5-7B": ({**_QWEN2, "num_hidden_layers": 28, "hidden_size": 3584,
                    "num_attention_heads": 28, "num_key_value_heads": 4,
                    "intermediate_size": 18944}, 15_231_233_024),
    "Qwen2.5-14B": ({**_QWEN2, "num_hidden_layers": 48, "hidden_size": 5120,
                     "num_attention_heads": 40, "num_key_value_heads": 8,
                     "intermediate_size": 13824}, 29_540_067_328),
    "Llama-3.1-70B": ({**_LLAMA, "num_hidden_layers": 80, "hidden_size": 8192,
                       "num_attention_heads": 64, "num_key_value_heads": 8,
                       "intermediate_size": 28672}, 141_107_412_992),
}


def write_shape(folder: Path, name: str, **overrides: Any) -> Path:
    """`folder` holding `name`'s config.json (with `overrides`) and its safetensors index."""
    config, total = SHAPES[name]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**config, **overrides}))
    index = {"metadata": {"total_size": total},
             "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder
