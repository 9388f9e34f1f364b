"""Floor 1: what every other floor may use and nothing of ours it imports.

settings (the one `Settings`), errors (AWS error shapes and codes), shapes (the SageMaker
request and response classes generated from botocore: the API parses requests with them,
workers rebuild stored requests with them), accounts (account and ARN helpers), queue
(task names and publishing), storage (the artifact store: local or S3), processes (free
ports, process liveness), deployment (the record a serve worker writes and
sagemaker-runtime reads) and backend_http (the HTTP/1.1 client of model servers: the
runtime proxy's hop and the split router's). Imports nothing of ours outside this package.
"""
