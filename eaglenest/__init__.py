"""EagleNest: a self-hosted, SageMaker-compatible EAGLE speculative-decoding service.

`eaglenest` is the one import name of the distribution. The repository keeps its code in
the top-level folders api/, workers/, models/, db/, migrations/ and foundation/; this
folder holds this file and a relative symlink to each of them, so `eaglenest.api` is api/
and so on (the wheel holds real copies under eaglenest/). Import them only as
`eaglenest.<folder>...`: a bare `import api` would load a second copy of every module it
touches (tests/test_layout.py fails on one).

The floors; a floor imports only the floors below it (.importlinter, checked by
`lint-imports` in CI and by tests/test_layers.py):

    4  eaglenest.api         control plane (POST / -> registry -> operations/<resource>)
                             and runtime/ (sagemaker-runtime: routes, relay, bodies,
                             backend client, event stream, capture)
       eaglenest.workers     jobs/ (optimization jobs), serving/ (endpoints and serving
                             processes), infra/ (Celery app, broker, supervisor,
                             reconciliation), cli/ (the `eaglenest` command)
       eaglenest.migrations  Alembic; imports db and foundation only
       The three never import each other: api and workers meet through the database
       and the task names foundation.queue publishes. One import crosses, by name in
       .importlinter: the `eaglenest api` command serves the API app in its process.
    3  eaglenest.models      pure torch + transformers (heads, training, decoding);
                             imports nothing of ours but itself
    2  eaglenest.db          tables, one repository per resource, pagination, sessions
    1  eaglenest.foundation  settings, AWS errors, SageMaker shapes (generated from
                             botocore), accounts/ARNs, task names and publishing, the
                             artifact store, process helpers, the deployment record
"""

__version__ = "0.1.0"
