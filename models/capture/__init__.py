"""capture: the frozen target's hidden states, computed once per training sample.

``cache`` keeps them in memory for the epochs of one run (``CaptureCache``, and the
``CaptureSource`` protocol training reads through); ``shards`` writes them to disk as
safetensors shards, for a head trained elsewhere or later; models/training/shard_source.py
reads the shards back as training data. See docs/capture-shards.md and docs/training.md;
where this sits among the packages: docs/architecture.md.
"""
