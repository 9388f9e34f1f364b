"""Workers: the Celery worker that runs optimization jobs and endpoints.

infra/ is the ground (the Celery app, context, placement, model fetch, broker, supervisor)
and model_servers/ the code that runs one model server; jobs/ (queue `train`) and serving/
(queue `serve`) are two rooms above them that never import each other and register their
own tasks, and app.py composes the worker's app from the three. The floors and the
contract that keeps them: docs/architecture.md and .importlinter.
"""
