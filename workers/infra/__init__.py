"""The workers' ground, imported by jobs/ and serving/ and importing neither: the Celery
app before any task (celery_app.py), a task's context (context.py), GPU placement
(placement.py), fetching models and heads (model_fetch.py), reconciliation, checkpoint
mirroring, the embedded broker and `eaglenest up`'s supervisor. docs/architecture.md."""
