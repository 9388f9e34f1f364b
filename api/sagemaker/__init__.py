"""One module per resource; importing this package registers every handler with SERVICE."""

from eaglenest.api.sagemaker import endpoint_configs, endpoints, models, optimization_jobs, tags
from eaglenest.api.sagemaker.service import SERVICE

__all__ = ["SERVICE", "endpoint_configs", "endpoints", "models", "optimization_jobs", "tags"]
