# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vLLM's module of the same path, for the conformance tests:
the names vLLM's tests and callers import from it, mapped to shmbroker's
drop-ins, and MsgpackSerde, vLLM's default serde, in its layout (a pickled
(type name, data bytes, part lengths) header, then the data) for the values
that need neither msgpack nor torch: anything pickle takes.
"""

import pickle

from shmbroker.vllm import (ObjectSerde, ShmObjectStorageHandle, SingleWriterShmObjectStorage,
                            SingleWriterShmRingBuffer)

__all__ = ["MsgpackSerde", "ObjectSerde", "ShmObjectStorageHandle",
           "SingleWriterShmObjectStorage", "SingleWriterShmRingBuffer"]


class MsgpackSerde(ObjectSerde):
    """vLLM's serde layout for pickled values; tensors and multimodal items
    (msgpack-encoded in vLLM) are not stood in for."""

    def serialize(self, value):
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        header = pickle.dumps(("bytes", len(data), None), protocol=pickle.HIGHEST_PROTOCOL)
        return data, len(data), header, len(header)

    def deserialize(self, data_view):
        type_name, nbytes, _lengths = pickle.loads(data_view)
        if type_name != "bytes":
            raise ValueError("Unsupported object type '%s' in metadata" % type_name)
        return pickle.loads(data_view[len(data_view) - nbytes:])
