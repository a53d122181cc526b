# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vllm.distributed.parallel_state: a module that takes
MessageQueue by name when it is imported, before the plugins are loaded,
and builds a group's broadcaster with it later, as vLLM's does."""

from vllm.distributed.device_communicators.shm_broadcast import MessageQueue


def make_broadcaster(n_reader, max_chunk_bytes, max_chunks):
    """The group's writer side, made through the name taken at import."""
    return MessageQueue(n_reader, n_reader, None, max_chunk_bytes, max_chunks)
