"""edge: see docs/architecture.md."""
