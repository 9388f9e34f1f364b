"""Optimization jobs (queue `train`): the task (optimize.py) claims a job and runs the
pipeline (pipeline.py): inputs (inputs.py: model, data, starting head, fetched from the
artifact store) -> options (options.py: OptimizationEnvironment) -> training, in this
process or data-parallel under torchrun (train_launch.py) -> the bench stage (bench_stage.py:
baseline vs speculative serving under the load generator, loadgen.py) -> publish. control.py
is the running job's lease, stop requests and runtime limit."""
