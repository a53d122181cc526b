# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vLLM's shm_object_storage module: the ring, the serdes and
the store with vLLM's public methods and parameters, doing nothing useful
(a call tells the test that vLLM's own class is in use)."""

STANDIN = True


def _standin(what):
    raise NotImplementedError("the stand-in vLLM's %s was called: shmbroker's drop-in is not "
                              "in place" % what)


class SingleWriterShmRingBuffer:
    def __init__(self, data_buffer_size, name=None, create=False):
        _standin("SingleWriterShmRingBuffer")

    def handle(self):
        _standin("SingleWriterShmRingBuffer.handle")

    def clear(self):
        _standin("SingleWriterShmRingBuffer.clear")

    def close(self):
        _standin("SingleWriterShmRingBuffer.close")

    def int2byte(self, integer):
        _standin("SingleWriterShmRingBuffer.int2byte")

    def byte2int(self, byte_data):
        _standin("SingleWriterShmRingBuffer.byte2int")

    def allocate_buf(self, size):
        _standin("SingleWriterShmRingBuffer.allocate_buf")

    def access_buf(self, address):
        _standin("SingleWriterShmRingBuffer.access_buf")

    def free_buf(self, is_free_fn, nbytes=None):
        _standin("SingleWriterShmRingBuffer.free_buf")


class ObjectSerde:
    def serialize(self, value):
        raise NotImplementedError

    def deserialize(self, data):
        raise NotImplementedError


class MsgpackSerde(ObjectSerde):
    """vLLM's default serde needs msgpack and torch; the tests pass their own."""


class SingleWriterShmObjectStorage:
    def __init__(self, max_object_size, n_readers, ring_buffer, serde_class=MsgpackSerde,
                 reader_lock=None):
        _standin("SingleWriterShmObjectStorage")

    def clear(self):
        _standin("SingleWriterShmObjectStorage.clear")

    def copy_to_buffer(self, data, data_bytes, metadata, md_bytes, data_view):
        _standin("SingleWriterShmObjectStorage.copy_to_buffer")

    def increment_writer_flag(self, id):
        _standin("SingleWriterShmObjectStorage.increment_writer_flag")

    def increment_reader_flag(self, data_view):
        _standin("SingleWriterShmObjectStorage.increment_reader_flag")

    def free_unused(self):
        _standin("SingleWriterShmObjectStorage.free_unused")

    def is_cached(self, key):
        _standin("SingleWriterShmObjectStorage.is_cached")

    def get_cached(self, key):
        _standin("SingleWriterShmObjectStorage.get_cached")

    def put(self, key, value):
        _standin("SingleWriterShmObjectStorage.put")

    def get(self, address, monotonic_id):
        _standin("SingleWriterShmObjectStorage.get")

    def touch(self, key, address=0, monotonic_id=0):
        _standin("SingleWriterShmObjectStorage.touch")

    def close(self):
        _standin("SingleWriterShmObjectStorage.close")

    def handle(self):
        _standin("SingleWriterShmObjectStorage.handle")

    @staticmethod
    def create_from_handle(handle):
        _standin("SingleWriterShmObjectStorage.create_from_handle")

    def default_is_free_check(self, id, buf):
        _standin("SingleWriterShmObjectStorage.default_is_free_check")
