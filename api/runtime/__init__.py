"""sagemaker-runtime: InvokeEndpoint and InvokeEndpointWithResponseStream. The request path:

    POST /endpoints/{name}/invocations[-response-stream]
     |  proxy.RuntimeASGI      plain ASGI ahead of FastAPI's router (proxy.install puts it
     |                         there); SigV4 as for the control plane (api.edge.sigv4)
     |  routes.Routes          endpoint -> variant (weight or TargetVariant) -> instance
     |                         (round-robin); rows cached from the database, re-read in the
     |                         background while in use
     |  bodies.translate       LMI or OpenAI body -> the model server's OpenAI request
     v  backend_http           the hop to the model server (vLLM or embedded; in
                               foundation, shared with the split router); an instance
                               that refuses the connection is skipped for the next one and a
                               serve worker is asked to restart it (foundation.queue)
     ^  InvokeEndpoint         one JSON reply (bodies.lmi_reply for LMI requests)
     |  ...ResponseStream      relay.FrameRelay: each SSE line of the model server becomes an
     |                         event-stream frame (eventstream) written from the socket
     |                         callback that read it; a failure after the first byte is a
     |                         ModelStreamError frame
     |  capture.CaptureWriter  sampled request/reply pairs (Data Capture) to the artifact
                               store, in JSONL files rolled by time and size

Errors carry their code in `x-amzn-ErrorType`: ValidationError (400) for unknown endpoints
and bad bodies, ModelError (424) when the model server fails.
"""
