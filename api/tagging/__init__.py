"""tagging: see docs/architecture.md."""
