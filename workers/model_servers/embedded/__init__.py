"""The embedded engine's HTTP server: vLLM's OpenAI surface over models.decode."""
