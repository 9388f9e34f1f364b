"""Workers: what runs the Celery tasks and the `eaglenest` command.

jobs/     optimization jobs (queue `train`): task, pipeline, options, inputs, control,
          training launcher, the bench stage and its load generator
serving/  endpoints (queue `serve`): the lifecycle tasks, deployment plans, serving
          processes (vLLM or the embedded engine, embedded/)
infra/    the Celery app, embedded broker, `eaglenest up` supervisor, reconciliation, task
          context, checkpoint mirroring, credentials, log format
cli/      the `eaglenest` command and its subcommands
"""
