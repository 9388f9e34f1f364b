"""What the tasks run on: the Celery app (celery_app.py), the embedded broker (broker.py),
`eaglenest up`'s supervisor (supervisor.py), start-up and periodic reconciliation with the
database (reconcile.py), a task's context (context.py), checkpoints mirrored to the
artifact store (checkpoint_sync.py), first-start credentials (credentials.py) and the log
format of every process (logs.py)."""
