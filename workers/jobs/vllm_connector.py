"""The KV connector that writes vLLM's extracted hidden states to files, on any device.

Loaded by name inside vLLM's engine (``kv_connector_module_path``) when a job captures with
EAGLENEST_CAPTURE_BACKEND=vllm (workers/jobs/vllm_capture.py). vLLM 0.32's
``ExampleHiddenStatesConnector`` copies a finished request's hidden states out of the cache
into pinned host memory on a CUDA stream, which fails on the CPU ("pin_memory=True requires
a CUDA or other accelerator backend"). This subclass keeps the parent's scheduler side, its
lock files and its file format (``hidden_states`` [tokens, n_layers, hidden] and
``token_ids`` [tokens], one safetensors file per request) and, when the cache is not on a
CUDA device, copies and writes synchronously in the engine's step: the file and its lock
are released before vLLM reports the request finished. On CUDA the parent's asynchronous
path runs unchanged.

The class is built on first access to ``HiddenStatesConnector`` (the module's
``__getattr__``; vLLM's connector factory asks for it by name), so importing this module
needs no vLLM: the service's environment has none.
"""

from __future__ import annotations

import functools
import os
from typing import Any

CONNECTOR = "HiddenStatesConnector"  # the name vLLM's kv_transfer_config asks for


class _Written:
    """Stands for the parent's CUDA event of a finished copy: already complete."""

    @staticmethod
    def query() -> bool:
        return True


@functools.cache
def _build() -> type:
    import torch
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector,
        PendingSave,
        extract_from_kv_cache,
    )

    class HiddenStatesConnector(ExampleHiddenStatesConnector):
        """ExampleHiddenStatesConnector with a synchronous write when the cache is on the
        CPU."""

        def _submit_async_write(self, pending: PendingSave) -> None:
            if self._kv_cache is not None and self._kv_cache.is_cuda:
                super()._submit_async_write(pending)
                return
            if not self._is_tp_rank_zero:
                return
            assert self._kv_cache is not None
            size = self._block_size
            # slot of token t = block_ids[t // size] * size + t % size; e.g. blocks [7, 2]
            # of size 4 -> slots 28..31, 8..11 (the first num_tokens of them are read)
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)  # [n_blocks]
            slots = (torch.arange(size).reshape(1, size)
                     + blocks.reshape(-1, 1) * size).flatten()  # [n_blocks * size]
            tokens = pending.token_ids.shape[0]
            states = extract_from_kv_cache(self._kv_cache, slots, tokens)  # [tokens, n, hidden]
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            try:
                save_file({"hidden_states": states.contiguous().clone(),
                           "token_ids": pending.token_ids.clone()}, pending.filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)  # releases the reader waiting on the lock file
            self._req_copy_events[pending.req_id] = _Written()  # type: ignore[assignment]

    HiddenStatesConnector.__module__ = __name__
    return HiddenStatesConnector


def __getattr__(name: str) -> Any:
    if name == CONNECTOR:
        return _build()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
