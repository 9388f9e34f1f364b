"""Optimization jobs (queue `train`): the task (optimize.py, which registers it) claims a
job and runs the pipeline (pipeline.py: inputs, options, capture, training, the bench
stage, publishing). Imports infra/ and model_servers/, never serving/.
docs/architecture.md."""
