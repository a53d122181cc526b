# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vLLM's shm_broadcast module: a Handle and a MessageQueue
with vLLM's public methods and parameters. Its methods do nothing useful:
calling one tells the test that vLLM's own class, not shmbroker's, is in
use."""

import dataclasses

STANDIN = True


def _standin(what):
    raise NotImplementedError("the stand-in vLLM's %s was called: shmbroker's drop-in is not "
                              "in place" % what)


@dataclasses.dataclass
class Handle:
    local_reader_ranks: list = dataclasses.field(default_factory=list)
    buffer_handle: tuple = None


class MessageQueue:
    def __init__(self, n_reader, n_local_reader, local_reader_ranks=None,
                 max_chunk_bytes=24 * 1024 * 1024, max_chunks=10, connect_ip=None):
        _standin("MessageQueue")

    def export_handle(self):
        _standin("MessageQueue.export_handle")

    @staticmethod
    def create_from_handle(handle, rank):
        _standin("MessageQueue.create_from_handle")

    def wait_until_ready(self):
        _standin("MessageQueue.wait_until_ready")

    def shutdown(self):
        _standin("MessageQueue.shutdown")

    def acquire_write(self, timeout=None):
        _standin("MessageQueue.acquire_write")

    def acquire_read(self, timeout=None, cancel=None, indefinite=False):
        _standin("MessageQueue.acquire_read")

    def enqueue(self, obj, timeout=None):
        _standin("MessageQueue.enqueue")

    def dequeue(self, timeout=None, cancel=None, indefinite=False):
        _standin("MessageQueue.dequeue")

    @staticmethod
    def recv(socket, timeout):
        _standin("MessageQueue.recv")

    def broadcast_object(self, obj=None):
        _standin("MessageQueue.broadcast_object")

    @staticmethod
    def create_from_process_group_single_reader(pg, max_chunk_bytes, max_chunks, reader_rank=0,
                                                blocking=False):
        _standin("MessageQueue.create_from_process_group_single_reader")

    @staticmethod
    def create_from_process_group(pg, max_chunk_bytes, max_chunks, writer_rank=0,
                                  external_writer_handle=None, blocking=True):
        _standin("MessageQueue.create_from_process_group")
