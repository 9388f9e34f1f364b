"""http: the HTTP plumbing of every server of ours: connection limits, the reply writer,
the model servers' client and guards (docs/architecture.md)."""
