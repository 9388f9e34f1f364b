"""edge: what every plane of the API shares: the signed-request record and SigV4 check,
bounded reads, the keys, AWS JSON 1.1 and its operation registry (docs/architecture.md)."""
