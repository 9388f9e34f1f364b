"""http: see docs/architecture.md."""
