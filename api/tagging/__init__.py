"""tagging: see docs/architecture.md. Importing it registers its handlers with SERVICE."""

from eaglenest.api.tagging.operations import SERVICE

__all__ = ["SERVICE"]
