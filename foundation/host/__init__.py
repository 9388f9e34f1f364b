"""host: see docs/architecture.md."""
