# SPDX-License-Identifier: Apache-2.0
"""The payload layout of an object made of several buffers ("frames").

One payload holds n frames, with a header giving the count and each length,
every frame 64-aligned so that numpy or torch views of it are aligned
(proto/PROTOCOL.md, "Objects of several buffers"; client/frames.c is the C
side). Integers are little-endian whatever the host:

    offset 0   u64  magic  0x314d52464253484d ("MHSBFRM1" as bytes)
    offset 8   u32  count  n, 0..65535
    offset 12  u32  flags  0
    offset 16  u64  length[n]
    zero padding up to header_size = align64(16 + 8n)
    frame 0 at header_size; frame i+1 at align64(end of frame i)
    payload size = header_size when n == 0, else end of the last frame

This module only computes and checks the layout over memoryviews; it knows
nothing of the daemon.
"""

import struct

from ._protocol import align64
from .errors import ProtocolError

__all__ = ["MAGIC", "MAX_FRAMES", "layout", "write_header", "write", "parse", "is_frames",
           "as_bytes"]

MAGIC = 0x314D52464253484D
MAX_FRAMES = 65535
_FIXED = struct.Struct("<QII")


def layout(lengths):
    """The layout of frames of these lengths: (header_size, offsets, total).

    offsets[i] is where frame i starts in the payload and total the payload's
    size. ValueError when there are more than MAX_FRAMES frames or a length
    is negative."""
    lengths = list(lengths)
    if len(lengths) > MAX_FRAMES:
        raise ValueError("%d frames: an object holds at most %d." % (len(lengths), MAX_FRAMES))
    header = align64(16 + 8 * len(lengths))
    offsets = []
    pos = header
    end = header
    for n in lengths:
        if n < 0:
            raise ValueError("A frame length cannot be negative (%d)." % n)
        pos = align64(end)
        offsets.append(pos)
        end = pos + n
    return header, offsets, end


def write_header(view, lengths):
    """Write the header (and its zero padding) of frames of these lengths at
    the start of view, a writable buffer of at least the header's size.
    Returns the layout, as layout() does."""
    lengths = list(lengths)
    header, offsets, total = layout(lengths)
    mv = memoryview(view).cast("B")
    if mv.nbytes < header:
        raise ValueError("A frames header of %d bytes does not fit in %d." % (header, mv.nbytes))
    head = bytearray(header)
    _FIXED.pack_into(head, 0, MAGIC, len(lengths), 0)
    if lengths:
        struct.pack_into("<%dQ" % len(lengths), head, 16, *lengths)
    mv[:header] = head
    return header, offsets, total


def write(view, bufs):
    """Write bufs (flat byte memoryviews, as as_bytes() gives) into view in
    the frames layout: the header, each frame at its offset, zeros between.
    view must hold exactly layout()'s total."""
    header, offsets, _ = write_header(view, [b.nbytes for b in bufs])
    end = header
    for b, o in zip(bufs, offsets):
        if o > end:
            view[end:o] = bytes(o - end)
        view[o:o + b.nbytes] = b
        end = o + b.nbytes


def _refuse(why):
    raise ProtocolError("EPROTO", "Not a frames payload: %s." % why)


def parse(view):
    """The frames of a payload, as memoryview slices of view (no copy).

    ProtocolError when the payload is not in the frames layout: shorter than
    16 bytes, a wrong magic, non-zero flags, a header longer than the payload,
    or a size other than exactly what the lengths give."""
    mv = memoryview(view)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    size = mv.nbytes
    if size < 16:
        _refuse("%d bytes, fewer than the 16 of its header" % size)
    magic, count, flags = _FIXED.unpack_from(mv, 0)
    if magic != MAGIC:
        _refuse("its first 8 bytes are 0x%016x, not the magic 0x%016x" % (magic, MAGIC))
    if flags != 0:
        _refuse("flags 0x%x, where only 0 is defined" % flags)
    if count > MAX_FRAMES:
        _refuse("%d frames, more than %d" % (count, MAX_FRAMES))
    header = align64(16 + 8 * count)
    if header > size:
        _refuse("a header of %d bytes (%d frames) in a payload of %d" % (header, count, size))
    lengths = struct.unpack_from("<%dQ" % count, mv, 16) if count else ()
    end = header
    offsets = []
    for n in lengths:
        pos = align64(end)
        offsets.append(pos)
        end = pos + n
        if end > size:
            _refuse("its lengths need more than the payload's %d bytes" % size)
    if end != size:
        _refuse("its lengths make %d bytes, the payload has %d" % (end, size))
    return [mv[o:o + n].toreadonly() for o, n in zip(offsets, lengths)]


def is_frames(view):
    """Whether view holds a payload in the frames layout."""
    try:
        parse(view)
    except ProtocolError:
        return False
    return True


def as_bytes(data):
    """A flat memoryview of unsigned bytes over data (any object with the
    buffer protocol). A buffer that is not C-contiguous is copied once into
    C order, as numpy's tobytes() does."""
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.nbytes == 0:
        return memoryview(b"")  # cast() refuses shapes with a zero
    if mv.c_contiguous:
        if mv.format == "B" and mv.ndim == 1:
            return mv
        return mv.cast("B")
    return memoryview(mv.tobytes())
