# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vLLM's multimodal cache module: takes the store's classes
by name, and makes the sender's store as vLLM's sender cache does (a named
ring it creates, the store over it); and its choice of cache, and the
sender cache, for the shared mode's hook."""

from vllm.distributed.device_communicators.shm_object_storage import (
    MsgpackSerde, SingleWriterShmObjectStorage, SingleWriterShmRingBuffer)

__all__ = ["MsgpackSerde", "ShmObjectStoreSenderCache", "SingleWriterShmObjectStorage",
           "SingleWriterShmRingBuffer", "sender_store"]


def sender_store(name, buffer_size, max_object_size, n_readers, serde_class):
    ring = SingleWriterShmRingBuffer(data_buffer_size=buffer_size, name=name, create=True)
    return SingleWriterShmObjectStorage(max_object_size=max_object_size, n_readers=n_readers,
                                        ring_buffer=ring, serde_class=serde_class)


def _get_cache_type(vllm_config):
    """Which multimodal cache vLLM uses: none when its size is 0, the
    per-process one when there is more than one API server (or data-parallel
    engines behind an internal balancer), else the one asked for."""
    mm = vllm_config.model_config.get_multimodal_config()
    if mm.mm_processor_cache_gb <= 0:
        return None
    p = vllm_config.parallel_config
    if not (p._api_process_count == 1
            and (p.data_parallel_size == 1 or p.data_parallel_external_lb)):
        return "processor_only"
    return mm.mm_processor_cache_type


class ShmObjectStoreSenderCache:
    """The API server's side of the shm cache, as vLLM's: the store of a
    named ring it writes, and the prompt updates of what it stored, kept in
    this process."""

    def __init__(self, name, buffer_size, max_object_size, n_readers, serde_class):
        self._shm_cache = sender_store(name, buffer_size, max_object_size, n_readers,
                                       serde_class)
        self._p0_cache = {}

    def is_cached_item(self, mm_hash):
        return self._shm_cache.is_cached(mm_hash)

    def get_and_update_item(self, mm_item, mm_hash):
        if self._shm_cache.is_cached(mm_hash):
            return self._shm_cache.get_cached(mm_hash), self._p0_cache[mm_hash]
        item, prompt_updates = mm_item
        try:
            pair = self._shm_cache.put(mm_hash, item)
        except (ValueError, MemoryError):
            return mm_item
        self._p0_cache[mm_hash] = prompt_updates
        return pair, prompt_updates

    def close(self):
        self._shm_cache.close()
