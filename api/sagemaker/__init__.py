"""One module per resource; importing this package registers every handler."""

from eaglenest.api.sagemaker import endpoint_configs, endpoints, models, optimization_jobs, tags

__all__ = ["endpoint_configs", "endpoints", "models", "optimization_jobs", "tags"]
