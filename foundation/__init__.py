"""Floor 1, what every other floor may use: settings, AWS errors, the generated shapes,
accounts, the task queue, job and server options; http/ (edges and plumbing), host/
(processes, threads, GPUs) and store/ (the artifact store). docs/architecture.md."""
