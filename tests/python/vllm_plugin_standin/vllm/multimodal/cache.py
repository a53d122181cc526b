# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vLLM's multimodal cache module: takes the store's classes
by name, and makes the sender's store as vLLM's sender cache does (a named
ring it creates, the store over it)."""

from vllm.distributed.device_communicators.shm_object_storage import (
    MsgpackSerde, SingleWriterShmObjectStorage, SingleWriterShmRingBuffer)

__all__ = ["MsgpackSerde", "SingleWriterShmObjectStorage", "SingleWriterShmRingBuffer",
           "sender_store"]


def sender_store(name, buffer_size, max_object_size, n_readers, serde_class):
    ring = SingleWriterShmRingBuffer(data_buffer_size=buffer_size, name=name, create=True)
    return SingleWriterShmObjectStorage(max_object_size=max_object_size, n_readers=n_readers,
                                        ring_buffer=ring, serde_class=serde_class)
