"""Serving backends behind one OpenAI-compatible HTTP surface: vLLM and the embedded engine."""
