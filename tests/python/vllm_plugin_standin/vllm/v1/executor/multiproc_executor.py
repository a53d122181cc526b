# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vllm.v1.executor.multiproc_executor: takes Handle and
MessageQueue by name; the tests import it after the plugins were loaded."""

from vllm.distributed.device_communicators.shm_broadcast import Handle, MessageQueue

__all__ = ["Handle", "MessageQueue"]
