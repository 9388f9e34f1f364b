"""GPU check: training speed, losslessness, verification cost and decoding speed on random
Llama targets, in one run that needs only torch + transformers + safetensors.

    bash scripts/gpu_check.sh [--device cuda|cpu] [--tiny] [--out DIR]
    python -m benchmarks.gpu_check --help

Targets are random-weight Llama configs built on the device (about 1B and 8B parameters;
``--tiny`` uses the tiny test config instead, seconds on a CPU). Heads are random or trained
for a few steps on random tokens: every number here is about speed or exactness, never
about draft quality. Per target, four sections (each one recorded on its own, an error in
one leaves the others running):

* ``training``: models.training.train steps/s for an EAGLE-3 and a P-EAGLE head (bf16 autocast on
  CUDA), measured after a warm-up, with the target's captures cached (every epoch after
  the first); ``capture_ms`` is the target forward a first-epoch step adds per sample.
* ``lossless``: greedy SpeculativeEngine output (plain, chain, tree, parallel) against HF
  ``generate(do_sample=False)``, token for token: fp32 must be equal (the exit status
  says so), bf16 divergences are counted and reported only.
* ``verify_cost``: the target's KV-cached forward time over n new tokens after a fixed
  context (the engine's verification forward), median of repeats, plus the heads'
  drafting times and the oracle speed ceiling (formula in ``CEILING_FORMULA``).
* ``throughput``: batch-1 tokens/s of HF generate and of the engine (plain, chain K with
  the random EAGLE-3 head, parallel K with the random P-EAGLE head, chain K with oracle
  drafts = full acceptance) on the same prompt, in bf16.
"""

CEILING_FORMULA = (
    "speedup(tau, K) = tau * t_target(1) / (t_target(K + 1) + t_draft(K)), where "
    "t_target(n) is the KV-cached target forward over n new tokens (verify_cost curve), "
    "tau the acceptance length (tokens emitted per round, bonus included, tau <= K + 1) and "
    "t_draft(K) the measured drafting of one round: chain = HeadDrafter.draft_chain(K) "
    "(K - 1 head steps) + one extend of the accepted tokens; parallel (P-EAGLE) = "
    "HeadDrafter.draft_parallel(K) (one forward over K - 1 mask slots) + one extend. "
    "'verify_only' sets t_draft = 0."
)
