"""Runs inside vLLM's worker process: loads the student's weights from a shared-memory file.

Legend: N bytes of the shared buffer.

vLLM (V1, >= 0.32) runs the model in a worker process behind an engine-core process; the trainer
holds ``vllm.LLM`` in its own. :class:`WeightSyncExtension` is mixed into vLLM's worker class
(``LLM(worker_extension_cls="xdistill.rollout.vllm_worker.WeightSyncExtension")``), so the
trainer calls its method by name through ``LLM.collective_rpc``: only the file path and the
layout travel through vLLM's message queues; the bytes are read from the file that the trainer
wrote (:class:`xdistill.rollout.vllm_engine.SharedWeights`, under ``/dev/shm`` where it exists).

This module imports torch only: it is imported in vLLM's worker, which has no xdistill state.
"""

from __future__ import annotations

import logging

import torch


def shared_views(path: str, nbytes: int, layout: list) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views into the ``nbytes``-byte file at ``path``; ``layout`` lists
    ``(name, dtype name, shape, byte offset)`` per tensor."""
    buf_N = torch.from_file(path, shared=True, size=int(nbytes), dtype=torch.uint8)
    out = []
    for name, dtype, shape, offset in layout:
        dt = getattr(torch, dtype)
        n = int(torch.Size(shape).numel()) * torch.empty((), dtype=dt).element_size()
        out.append((name, buf_N[offset:offset + n].view(dt).view(tuple(shape))))
    return out


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker)."""

    def xdistill_load_shared(self, path: str, nbytes: int, layout: list) -> list[str]:
        """Load the weights in ``path`` into the engine's model; returns the engine parameters
        that were NOT written (empty when every one was).

        The steps of vLLM 0.32's in-place ``reload_weights`` (``vllm.model_executor.model_loader
        .reload.inplace``), which only logs what it missed: the layerwise reload restores the
        weight loaders dropped after the first load (on CPU the linear weights were repacked
        for its kernels), the model's ``load_weights`` maps Hugging Face names (fusing q/k/v and
        gate/up), and the post-load processing (the repacking) runs again per layer.
        """
        # deferred: vllm (optional: lives in its own venv, .venv-vllm)
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload,
                                                             initialize_layerwise_reload)

        # per sync, vLLM warns "RotaryEmbedding: Failed to load weights": its cos/sin cache is a
        # buffer that no checkpoint holds, and is kept as it was
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        cached = getattr(self, "_xdistill_shared", None)
        if cached is None or cached[0] != path:  # mapped once: the trainer then unlinks the file
            cached = self._xdistill_shared = (path, shared_views(path, nbytes, layout))
        model = self.get_model()
        expected = {name for name, _ in model.named_parameters()}
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            initialize_layerwise_reload(model)
            loaded = model.load_weights(iter(cached[1]))
            finalize_layerwise_reload(model, self.vllm_config.model_config)
        return sorted(expected - set(expected if loaded is None else loaded))
