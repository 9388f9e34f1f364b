"""model_servers: see docs/architecture.md."""
