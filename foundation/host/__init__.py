"""This host's processes and resources: owned children (children.py, forking.py), the
compute ledger and thread plans (threads.py), ceilings, GPUs, free ports and live pids,
background loops. docs/architecture.md."""
