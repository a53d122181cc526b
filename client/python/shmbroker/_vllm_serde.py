# SPDX-License-Identifier: Apache-2.0
"""The serdes of the store drop-in (shmbroker.vllm): vLLM's ObjectSerde
interface and the default PickleSerde, which writes the frames layout
(frames.py) with out-of-band buffers so that large values are copied once,
straight into the segment.

This module knows pickle and the frames layout, nothing of the daemon, the
ring or the store; shmbroker.vllm re-exports its public names.
"""

import abc
import pickle
import struct
from typing import Any, Tuple

from . import frames as _frames
from . import _protocol as P
from .pickling import pickle_frames, unpickle_frames


class ObjectSerde(abc.ABC):
    """vLLM's serializer interface (shm_object_storage.ObjectSerde).

    serialize(value) returns (data, nbytes, metadata, md_bytes): data is one
    buffer or a list of buffers, nbytes their total size, metadata a buffer
    of md_bytes bytes. The store writes metadata then the data buffers one
    after the other, and deserialize() receives a read-only memoryview of
    exactly those md_bytes + nbytes bytes. vLLM's own serdes (MsgpackSerde)
    follow it and can be passed as serde_class."""

    @abc.abstractmethod
    def serialize(self, value: Any) -> Tuple[Any, int, bytes, int]:
        """Serialize value: (data, nbytes, metadata, md_bytes)."""
        raise NotImplementedError

    @abc.abstractmethod
    def deserialize(self, data: memoryview) -> Any:
        """Rebuild the value from the bytes serialize() gave."""
        raise NotImplementedError


class _OutOfBand:
    """bytes or bytearray pickled as cls(its out-of-band buffer): the pickle
    stream is then the same few bytes whatever the value (_OOB_STREAMS)."""

    __slots__ = ("cls", "data")

    def __init__(self, cls, data):
        self.cls, self.data = cls, data

    def __reduce_ex__(self, protocol):
        return self.cls, (pickle.PickleBuffer(self.data),)


def _oob_stream(cls):
    return pickle.dumps(_OutOfBand(cls, cls(1)), protocol=5, buffer_callback=lambda b: False)


# bytes and bytearray from this size up go out of band: their bytes are
# copied once, into the segment, instead of into a pickle stream first.
_OOB_MIN = 1024
# The pickle stream of each type sent out of band, and its frames payload's
# start: the header of two frames (the stream, the bytes) and the stream,
# padded to 64 bytes; the second frame's length is written per value.
_OOB_STREAMS = {cls: _oob_stream(cls) for cls in (bytes, bytearray)}
_FRAMES_TWO = struct.Struct("<QIIQQ")


def _oob_prefix(stream):
    head = bytearray(P.align64(64 + len(stream)))
    _FRAMES_TWO.pack_into(head, 0, _frames.MAGIC, 2, 0, len(stream), 0)
    head[64:64 + len(stream)] = stream
    return bytes(head)


_OOB_PREFIXES = {cls: _oob_prefix(stream) for cls, stream in _OOB_STREAMS.items()}


class PickleSerde(ObjectSerde):
    """The default serde: pickle protocol 5 with out-of-band buffers, in the
    frames layout (frame 0 the pickle stream, then each out-of-band buffer,
    64-aligned), so that a numpy array's data, and bytes or a bytearray of
    1 KiB or more, are copied once, straight into the segment.
    deserialize() copies the buffers out: the value owns its memory (the
    store releases its pin right after)."""

    def serialize(self, value):
        """The frames payload of value, as a list of pieces to write in order
        (header, frames, the zero padding between them): (pieces, nbytes, b"", 0)."""
        cls = type(value)
        if (cls is bytes or cls is bytearray) and len(value) >= _OOB_MIN:
            head = bytearray(_OOB_PREFIXES[cls])
            head[24:32] = len(value).to_bytes(8, "little")
            return [head, value], len(head) + len(value), b"", 0
        parts = pickle_frames(value)
        lengths = [p.nbytes for p in parts]
        head = bytearray(_frames.layout(lengths)[0])
        header, offsets, total = _frames.write_header(head, lengths)
        pieces = [head]
        end = header
        for part, offset in zip(parts, offsets):
            if offset > end:
                pieces.append(bytes(offset - end))
            pieces.append(part)
            end = offset + part.nbytes
        return pieces, total, b"", 0

    def deserialize(self, data):
        """The value of a frames payload (ProtocolError when data is not one)."""
        mv = data if type(data) is memoryview else memoryview(data)
        if mv.format == "B" and mv.ndim == 1 and mv.nbytes >= _FRAMES_TWO.size:
            # Two frames, a pickle stream and one out-of-band buffer (bytes
            # or a bytearray as serialize() lays them out, a numpy array in
            # a dict...), told from the header with the checks of
            # frames.parse() for two frames, without the general parse: the
            # get of such a value is mostly this.
            magic, count, flags, len0, n = _FRAMES_TWO.unpack_from(mv, 0)
            if magic == _frames.MAGIC and count == 2 and flags == 0:
                start = P.align64(64 + len0)
                if start + n == mv.nbytes:
                    stream = mv[64:64 + len0]
                    for cls, oob in _OOB_STREAMS.items():
                        if len0 == len(oob) and stream == oob:
                            return cls(mv[start:])
                    # One copy of the buffer: the value owns its memory.
                    return pickle.loads(stream, buffers=(bytearray(mv[start:]),))
        parts = _frames.parse(data)
        if len(parts) == 2:
            # bytes or a bytearray sent out of band: made from the buffer
            # with one copy (unpickling would copy it twice).
            for cls, stream in _OOB_STREAMS.items():
                if parts[0] == stream:
                    return cls(parts[1])
        return unpickle_frames(parts, copy=True)
