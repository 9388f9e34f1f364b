"""training: ``train(config, data, device) -> TrainResult`` and what it runs on.

``config`` (``TrainConfig``, which heads, checkpoints, the optimizer and the evaluation read
without importing the trainer), ``train`` (the loop, checkpoints, resume), ``optim``
(Muon + AdamW, the LR schedule), ``evaluate`` (held-out accuracy, plateau, stop),
``batches`` and ``distributed`` (each rank's samples, DDP under torchrun), ``partition``
(P-EAGLE sequence partitioning), ``shard_source`` (training from capture shards, without the
target's decoder). How to train: docs/training.md; the package map: docs/architecture.md.
"""
