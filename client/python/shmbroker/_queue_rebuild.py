# SPDX-License-Identifier: Apache-2.0
"""The calls that rebuild a message sent as a buffer (bytes, bytearray,
memoryview, a CPU torch tensor) from its out-of-band frame, with the checks
of the shapes and types a stream hands them, which come from another
process and may be hostile.

A buffer message's pickle stream names these calls, as PROTOCOL.md section
9 says, shmbroker.queue._rebuild_*: that is where unpickling finds them,
whatever file holds their code (see the end of this module). The encoding
that writes such streams is _queue_codec's.
"""

from ._queue_layout import _corrupt
from .errors import Unsupported


def _rebuild_bytes(buf):
    """bytes from an out-of-band buffer (unpickling)."""
    return bytes(buf)


def _rebuild_bytearray(buf):
    """bytearray from an out-of-band buffer: the buffer itself when the
    unpickler was given a copy already (unpickle_frames' bytearray)."""
    return buf if type(buf) is bytearray else bytearray(buf)


# A shape from a message has at most this many dimensions (memoryview's own
# limit), each a non-negative int below 2**63 (what a C size holds).
_NDIM_MAX = 64


def _shape_of(shape, what, nbytes):
    """shape, from a message's stream, as a tuple of ints, or an EIO naming
    it: anything but a tuple or list of at most _NDIM_MAX non-negative ints
    below 2**63 is a stream no writer of this module makes (a scribbled or
    hostile one), which must not reach cast() or torch as it is."""
    if type(shape) not in (tuple, list) or len(shape) > _NDIM_MAX or \
            not all(type(d) is int and 0 <= d < (1 << 63) for d in shape):
        raise _corrupt("a %s message of %d bytes has shape %.200r, which is not a tuple of at "
                       "most %d non-negative integers" % (what, nbytes, shape, _NDIM_MAX))
    return tuple(shape)


def _rebuild_memoryview(buf, fmt, shape):
    """A memoryview of format fmt and shape over a copy of buf's bytes."""
    shape = _shape_of(shape, "memoryview", len(buf))
    own = buf if type(buf) is bytearray else bytearray(buf)
    view = memoryview(own)
    if fmt == "B" and len(shape) == 1 and shape[0] == len(own):
        return view
    try:
        return view.cast(fmt, shape)
    except (TypeError, ValueError) as e:
        raise _corrupt("a memoryview message of format %.200r and shape %r does not fit its %d "
                       "bytes (%s)" % (fmt, shape, len(own), e)) from None


def _rebuild_tensor(buf, dtype, shape):
    """A CPU torch tensor of dtype (torch's attribute name) and shape over a
    copy of buf's bytes; Unsupported when torch cannot be imported here."""
    try:
        import torch
    except ImportError:
        raise Unsupported("ENOSYS", "This message is a torch tensor (%.200s, shape %.200r), "
                          "and torch cannot be imported in this process: install torch here, "
                          "or send numpy arrays (tensor.numpy()), which need only numpy."
                          % (dtype, shape)) from None
    shape = _shape_of(shape, "tensor", len(buf))
    kind = getattr(torch, dtype, None) if type(dtype) is str else None
    if not isinstance(kind, torch.dtype):
        raise _corrupt("a tensor message names dtype %.200r, which this torch does not have"
                       % (dtype,))
    if len(buf) == 0:
        # No bytes: a shape of no elements, or the message would be a
        # tensor of memory that nobody sent (as large as the shape says).
        if _elements(shape) != 0:
            raise _corrupt("a tensor message of no bytes has shape %r, of %s elements"
                           % (shape, _elements(shape)))
        try:
            return torch.empty(shape, dtype=kind)
        except (RuntimeError, TypeError, ValueError) as e:
            raise _corrupt("a tensor message of no bytes has shape %r (%s)" % (shape, e)) \
                from None
    own = buf if type(buf) is bytearray else bytearray(buf)
    try:
        return torch.frombuffer(own, dtype=torch.uint8).view(kind).reshape(shape)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _corrupt("a tensor message of dtype %s and shape %r does not fit its %d bytes "
                       "(%s)" % (dtype, shape, len(own), e)) from None


def _elements(shape):
    """The number of elements of shape (a checked tuple of ints)."""
    n = 1
    for d in shape:
        n *= d
    return n


# Streams name these calls in shmbroker.queue (PROTOCOL.md section 9), as
# before they had a file of their own, so that readers of every version of
# the package find them. queue.py imports them from here before it imports
# _queue_codec, whose streams of bytes and bytearray are pickled at import
# and need the calls found in shmbroker.queue by then.
for _rebuild in (_rebuild_bytes, _rebuild_bytearray, _rebuild_memoryview, _rebuild_tensor):
    _rebuild.__module__ = __package__ + ".queue"
del _rebuild
