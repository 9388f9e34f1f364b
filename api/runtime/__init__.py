"""runtime: sagemaker-runtime (InvokeEndpoint, InvokeEndpointWithResponseStream), a
plain-ASGI layer that relays to the model servers (docs/architecture.md)."""
