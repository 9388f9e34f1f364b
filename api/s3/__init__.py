"""s3: an S3-compatible API (path-style) on the SageMaker API's own endpoint, over the
artifact store (docs/s3-api.md); mounted by api/s3/mount.py (docs/architecture.md)."""
