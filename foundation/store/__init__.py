"""store: the artifact store (`s3://` URIs over S3 or a local folder) and its per-account
view (docs/architecture.md)."""
