"""One model server, vLLM's or the embedded engine's, behind one OpenAI-compatible HTTP
surface: its process (process.py), options, speculation schedule and split router; started
by endpoints (serving/) and by a job's bench stage (jobs/). docs/architecture.md."""
