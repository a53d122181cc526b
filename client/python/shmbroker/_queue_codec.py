# SPDX-License-Identifier: Apache-2.0
"""A queue's messages as bytes: the frames layout of a message written into
a slot or an overflow object (frames.py's, with a short way for one frame
or two), and the encoding of an object into frames: bytes, bytearray,
memoryview and CPU torch tensors out of band, anything else pickled
(protocol 5, numpy arrays' data out of band).

The calls that rebuild buffers are _queue_rebuild's. This module knows
nothing of slots, waits or the daemon: MessageQueue (queue) hands it the
views to write into or read from.
"""

import pickle
import struct

from . import frames as _frames
from ._queue_rebuild import (_rebuild_bytearray, _rebuild_bytes, _rebuild_memoryview,
                             _rebuild_tensor)
from .pickling import pickle_frames, unpickle_frames


# The frames header of a message of one frame (no out-of-band buffer: most
# messages): magic, count 1, flags 0, the length; the frame at byte 64.
_ONE_FRAME = struct.Struct("<QIIQ")
_ONE_FRAME_AT = 64
_ONE_FRAME_PAD = bytes(_ONE_FRAME_AT - 24)
# And of two (a buffer sent out of band, and its small stream: the frame 0
# at byte 64, the buffer at the next multiple of 64 after it).
_TWO_FRAMES = struct.Struct("<QIIQQ")
_TWO_FRAMES_PAD = bytes(_ONE_FRAME_AT - 32)
_ZEROS_64 = bytes(64)
_SECOND_LENGTH = struct.Struct("<Q")
# The whole 64 bytes before a lone frame: its header and the zeros after it,
# written by one call.
_ONE_FRAME_HEADER = struct.Struct("<QIIQ%dx" % (_ONE_FRAME_AT - 24))
_FRAMES_MAGIC = _frames.MAGIC
_dumps = pickle.dumps
_loads = pickle.loads


# ---- messages that are buffers ------------------------------------------------
#
# bytes, bytearray, memoryview and CPU torch tensors sent as a message of
# their own travel out of band, as numpy arrays do with pickle's protocol 5:
# frame 0 a small pickle stream that rebuilds the object from frame 1, and
# frame 1 the object's bytes, written straight into the slot (or overflow
# object) with no pickled copy. Any reader unpickles such a message as any
# other (PROTOCOL.md section 9, "Messages"); this module's readers go
# straight to the result for bytes and bytearray, whose stream is always
# the same. Smaller bytes and bytearray are pickled in the stream: for a
# few hundred bytes that is cheaper than a second frame.
_OOB_MIN = 1024


class _OutOfBand:
    """Pickles as rebuild(the buffer, *args), the buffer out of band."""

    __slots__ = ("rebuild", "buf", "args")

    def __init__(self, rebuild, buf, args=()):
        self.rebuild, self.buf, self.args = rebuild, buf, args

    def __reduce_ex__(self, protocol):
        return self.rebuild, (pickle.PickleBuffer(self.buf),) + self.args


def _oob_frames(rebuild, buf, args=()):
    """[the pickle stream, buf's bytes] of a message rebuilt by rebuild."""
    oob = []
    stream = pickle.dumps(_OutOfBand(rebuild, buf, args), protocol=5,
                          buffer_callback=oob.append)
    return [memoryview(stream), oob[0].raw()]


# The streams of bytes and bytearray messages depend on the type alone.
_BYTES_STREAM = bytes(_oob_frames(_rebuild_bytes, b"")[0])
_BYTEARRAY_STREAM = bytes(_oob_frames(_rebuild_bytearray, bytearray())[0])
_BYTES_LEN, _BYTEARRAY_LEN = len(_BYTES_STREAM), len(_BYTEARRAY_STREAM)
_STREAMS = {bytes: memoryview(_BYTES_STREAM), bytearray: memoryview(_BYTEARRAY_STREAM)}


def _message_frames(obj):
    """The frames of message obj (frames.py's layout): out of band for the
    buffers above, else pickle_frames'."""
    frames = _buffer_frames(obj)
    return frames if frames is not None else pickle_frames(obj)


# Types that are never one of the buffers above: most messages are one of
# these, and need no further look.
_PICKLED = frozenset((tuple, list, dict, str, int, float, bool, type(None), set))


def _buffer_frames(obj):
    """The frames of message obj when it is one of the buffers above (out
    of band), else None: obj is pickled."""
    kind = type(obj)
    if kind in _PICKLED:
        return None
    if kind is bytes or kind is bytearray:
        if len(obj) >= _OOB_MIN:
            return [_STREAMS[kind], memoryview(obj)]
    elif kind is memoryview:
        if obj.c_contiguous:
            try:
                flat = obj.cast("B")
                if obj.format != "B" or obj.ndim != 1:
                    flat.cast(obj.format, obj.shape)  # what the reader will do
            except (TypeError, ValueError):
                flat = None  # a format cast() does not take: its bytes, as format B
            if flat is not None:
                return _oob_frames(_rebuild_memoryview, flat, (obj.format, obj.shape))
        raw = obj.tobytes()
        return _oob_frames(_rebuild_memoryview, raw, ("B", (len(raw),)))
    elif kind.__name__ == "Tensor" and kind.__module__ == "torch":
        return _tensor_frames(obj)
    return None


# ---- pickled straight into a slot --------------------------------------------
#
# pickle.dumps builds its stream in a buffer of its own that it grows as it
# goes: for a message of a MiB that is fresh memory on every call (about
# half a millisecond here, against 30 us to copy the MiB), and then the
# stream is copied into the slot. A Pickler given a file that writes into
# the slot makes neither: the stream lands at byte 64 (frame 0), and pickle
# hands a large bytes or bytearray in it to write() as it is, copied once.
# For a message of a few hundred bytes the file's write() call costs more
# than the buffer it saves, so the writer picks by the size of its last
# message (see MessageQueue._enqueue).

# A stream this long is worth pickling straight into the slot.
DIRECT_MIN = 32 << 10
# Frames a header of 64 bytes describes (16 + 8 per frame): frame 0 at byte
# 64 holds for a stream and up to five out-of-band buffers.
DIRECT_MAX_FRAMES = (_ONE_FRAME_AT - 16) // 8


class _IntoView:
    """pickle's file: writes the stream into view from byte 64 on. A stream
    that runs past view's end goes on in a bytearray of its own (spill),
    what was written into view copied into it first: the message is then
    sent as frames, without pickling it a second time (its __reduce__ may
    not give the same twice, and a large one costs its pickling again)."""

    __slots__ = ("view", "at", "end", "spill")

    def __init__(self, view):
        self.view, self.at, self.end, self.spill = view, _ONE_FRAME_AT, view.nbytes, None

    def write(self, b):
        n = b.nbytes if type(b) is memoryview else len(b)
        if self.spill is not None:
            self.spill += b
            return n
        at = self.at
        if at + n > self.end:
            self.spill = bytearray(self.view[_ONE_FRAME_AT:at])
            self.spill += b
            return n
        self.view[at:at + n] = b
        self.at = at + n
        return n


def _pickle_into(view, obj):
    """Pickle obj (protocol 5, out-of-band buffers) straight into view in
    the frames layout: the bytes written (an int), or, when the message
    does not fit view or has more out-of-band buffers than a 64-byte header
    holds, its frames (a list, as pickle_frames gives them, the stream a
    copy: nothing of view is published) for the caller to send otherwise.
    obj is pickled once either way. Errors of pickling obj are raised as
    pickle raises them."""
    out = _IntoView(view)
    oob = []
    pickle.Pickler(out, protocol=5, buffer_callback=oob.append).dump(obj)
    bufs = []
    for buf in oob:
        try:
            bufs.append(buf.raw())
        except BufferError:
            bufs.append(memoryview(memoryview(buf).tobytes()))
    if out.spill is not None:
        return [memoryview(out.spill)] + bufs
    n0 = out.at - _ONE_FRAME_AT
    if not oob:
        _ONE_FRAME.pack_into(view, 0, _frames.MAGIC, 1, 0, n0)
        view[24:_ONE_FRAME_AT] = _ONE_FRAME_PAD
        return out.at
    lengths = [n0] + [b.nbytes for b in bufs]
    header, offsets, total = _frames.layout(lengths)
    if len(oob) + 1 > DIRECT_MAX_FRAMES or total > view.nbytes:
        return [memoryview(bytes(view[_ONE_FRAME_AT:out.at]))] + bufs
    _frames.write_header(view, lengths)
    end = out.at
    for b, at in zip(bufs, offsets[1:]):
        view[end:at] = _ZEROS_64[:at - end]
        view[at:at + b.nbytes] = b
        end = at + b.nbytes
    return total


def _tensor_frames(t):
    """A dense CPU tensor's frames, or None for any other (pickled as torch
    pickles it)."""
    try:
        import torch
        if (t.device.type != "cpu" or t.layout != torch.strided or t.requires_grad
                or t.is_quantized or t.is_conj() or t.is_neg()):
            return None
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    except (ImportError, RuntimeError, TypeError, AttributeError):
        return None  # no numpy, or a tensor numpy cannot view
    dtype = str(t.dtype).rpartition(".")[2]
    return _oob_frames(_rebuild_tensor, raw, (dtype, tuple(t.shape)))


def _decode(views):
    """The message in views (frames as _read_message gives them): bytes
    and bytearray straight from their frame, anything else unpickled with
    its out-of-band buffers copied (the object owns its memory)."""
    if len(views) == 2:
        head = views[0]
        if head.nbytes == _BYTES_LEN and head == _BYTES_STREAM:
            return bytes(views[1])
        if head.nbytes == _BYTEARRAY_LEN and head == _BYTEARRAY_STREAM:
            return bytearray(views[1])
    return unpickle_frames(views, copy=True)


def _decode_at(mv, at, length):
    """The message of length bytes at offset at of mv (a slot's payload),
    as _decode(_read_message(...)) gives it: a lone frame (most messages)
    unpickled straight from its place, anything else through the frames."""
    if length >= _ONE_FRAME_AT:
        magic, count, flags, n0 = _ONE_FRAME.unpack_from(mv, at)
        if count == 1 and magic == _FRAMES_MAGIC and not flags and n0 == length - _ONE_FRAME_AT:
            return _loads(mv[at + _ONE_FRAME_AT:at + length])
    view = mv[at:at + length]
    try:
        return _decode_payload(view)
    finally:
        view.release()


def _decode_payload(payload):
    """The message a slot's payload (or an overflow object's) holds, its
    frames' views released after."""
    views = _read_message(payload)
    try:
        return _decode(views)
    finally:
        for v in views:
            v.release()


def _message_size(bufs):
    """Bytes of the frames payload of bufs."""
    if len(bufs) == 1:
        return _ONE_FRAME_AT + bufs[0].nbytes
    if len(bufs) == 2:
        return ((_ONE_FRAME_AT + bufs[0].nbytes + 63) & ~63) + bufs[1].nbytes
    return _frames.layout([b.nbytes for b in bufs])[2]


def _write_message(view, bufs):
    """Write bufs into view (exactly _message_size bytes) in the frames
    layout; frames.write's result, without its generality for one frame or
    two."""
    if len(bufs) == 2:
        n0, n1 = bufs[0].nbytes, bufs[1].nbytes
        end0 = _ONE_FRAME_AT + n0
        at1 = (end0 + 63) & ~63
        _TWO_FRAMES.pack_into(view, 0, _frames.MAGIC, 2, 0, n0, n1)
        view[32:_ONE_FRAME_AT] = _TWO_FRAMES_PAD
        view[_ONE_FRAME_AT:end0] = bufs[0]
        view[end0:at1] = _ZEROS_64[:at1 - end0]
        view[at1:at1 + n1] = bufs[1]
        return
    if len(bufs) != 1:
        _frames.write(view, bufs)
        return
    n = bufs[0].nbytes
    _ONE_FRAME.pack_into(view, 0, _frames.MAGIC, 1, 0, n)
    view[24:_ONE_FRAME_AT] = _ONE_FRAME_PAD
    view[_ONE_FRAME_AT:_ONE_FRAME_AT + n] = bufs[0]


def _read_message(view):
    """The frames of a message (views into view), as frames.parse."""
    size = view.nbytes
    if size >= _ONE_FRAME_AT:
        magic, count, flags, n0 = _ONE_FRAME.unpack_from(view, 0)
        if magic == _frames.MAGIC and flags == 0:
            if count == 1:
                if n0 == size - _ONE_FRAME_AT:
                    return [view[_ONE_FRAME_AT:].toreadonly()]
            elif count == 2:
                n1 = _SECOND_LENGTH.unpack_from(view, 24)[0]
                end0 = _ONE_FRAME_AT + n0
                at1 = (end0 + 63) & ~63
                if at1 + n1 == size:
                    return [view[_ONE_FRAME_AT:end0].toreadonly(), view[at1:].toreadonly()]
    return _frames.parse(view)
