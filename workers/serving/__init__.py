"""Endpoints (queue `serve`): the lifecycle tasks (endpoints.py, which registers them),
deployment plans, placement over hosts, traffic shifts. Imports infra/ and
model_servers/, never jobs/. docs/architecture.md."""
