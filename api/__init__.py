"""api: the API process, one folder per service (sagemaker/, tagging/, runtime/, s3/) on
the edge they share (edge/), mounted by api/app.py; the map is docs/architecture.md."""
