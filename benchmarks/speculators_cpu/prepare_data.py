"""Build speculators' training dataset (HF arrow) from pre-tokenized rows; runs in the venv.

    python prepare_data.py MODEL TRAIN.jsonl HELD_OUT.jsonl OUT_DIR [--seq-length 512]

Rows are ``{"input_ids": [...], "loss_mask": [...]}`` ("speculator-format rows"), written by
benchmarks/speculators_compare.py from the same encoded samples our trainer uses.

Why not plain ``speculators prepare-data --data chat.jsonl``:

* Chat rows need a running vLLM ``/render`` server to tokenize them
  (speculators/data_generation/preprocessing.py:611-616); pre-tokenized rows pass
  straight through (preprocessing.py:458-483, only truncated to ``--seq-length``).
* prepare-data shuffles and concatenates every ``--data`` file (preprocessing.py:869,907)
  and the trainer splits train / validation by row index (speculators/train/data.py:172),
  with a validation split that must not be empty (train/dataloader.py:128). To train on
  exactly our training rows, they are prepared alone (so ``token_freq.pt``, from which the
  trainer builds the 8192-token draft vocabulary, counts training rows only,
  preprocessing.py:909-914) and the held-out rows are appended after them as the
  validation tail; the trainer is run with ``--train-data-ratio (n_train + 0.5) / n``.
"""

import argparse
import json
from pathlib import Path

from datasets import concatenate_datasets
from speculators.data_generation.preprocessing import load_and_preprocess_dataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("train")
    ap.add_argument("held_out")
    ap.add_argument("out")
    ap.add_argument("--seq-length", type=int, default=512)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for path, freq in ((a.train, True), (a.held_out, False)):
        ds, _ = load_and_preprocess_dataset(
            a.model, [path], seq_length=a.seq_length, build_dataset_num_proc=1,
            token_freq_path=out / "token_freq.pt", skip_token_freq=not freq)
        parts.append(ds)
    concatenate_datasets(parts).save_to_disk(str(out))
    meta = {"train_rows": len(parts[0]), "val_rows": len(parts[1])}
    (out / "rows.json").write_text(json.dumps(meta))
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
