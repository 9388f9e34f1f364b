"""models: pure torch + transformers (it imports nothing of ours but itself).

``target`` loads a target model and captures the hidden states the heads consume;
``heads/`` holds the draft heads and their registry; ``data/`` the training examples;
``capture/`` the target's captured features (in memory or as shards on disk);
``training/`` the trainer and its ``TrainConfig``; ``checkpoint`` the vLLM / speculators
formats; ``decode/`` the embedded speculative-decoding engine; ``commands`` the ``train`` and
``prepare-target`` subcommands; ``prepare`` and ``tiny`` targets built offline.
Where it sits among the packages: docs/architecture.md; how a head is trained:
docs/training.md.
"""
