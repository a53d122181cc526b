# SPDX-License-Identifier: Apache-2.0
"""Python objects in the segment: pickle protocol 5 with out-of-band buffers,
stored as one frames payload.

Frame 0 is the pickle stream; frames 1..n are the object's out-of-band
buffers (a numpy array's data, a pickle.PickleBuffer), copied once from the
object straight into the allocation, 64-aligned. loads_from() unpickles
such a payload either copying (the pin released at once) or zero-copy over
the pinned segment, the pin then kept until the last object using those
bytes is garbage-collected. This module knows pickle and the frames layout;
the wire is the Client's.

Unpickling runs code that the pickled bytes name, and every read-write
client of a daemon can write any byte of its segment: load only objects of
processes you trust (keep the daemon's socket to one user, or use
--allow-uid), as with pickle anywhere.
"""

import itertools
import pickle
import weakref

from . import frames as _frames

__all__ = ["dumps_into", "loads_from", "pickle_frames", "unpickle_frames"]

# Out-of-band buffers need protocol 5; it is also the highest of Python 3.9-3.12.
DEFAULT_PROTOCOL = 5


def pickle_frames(obj, *, protocol=DEFAULT_PROTOCOL):
    """Pickle obj and return its frames: a list of flat byte memoryviews,
    the pickle stream first, then each out-of-band buffer (no copy of
    them: they view the object's own memory). With a protocol below 5
    everything is in the stream and the list has one frame."""
    oob = []
    if protocol is None or protocol < 0 or protocol >= 5:
        stream = pickle.dumps(obj, protocol=protocol, buffer_callback=oob.append)
    else:
        stream = pickle.dumps(obj, protocol=protocol)
    return _frames_of(stream, oob)


def _frames_of(stream, oob):
    """The frames of an object pickled into stream, its out-of-band
    buffers (PickleBuffer) in oob: the stream, then each buffer."""
    parts = [memoryview(stream)]
    for buf in oob:
        try:
            parts.append(buf.raw())
        except BufferError:
            # Not contiguous: its bytes in C order, as memoryview.tobytes().
            parts.append(memoryview(memoryview(buf).tobytes()))
    return parts


def unpickle_frames(frames, *, copy=True):
    """Unpickle from frames as pickle_frames() makes them (any sequence of
    buffers). With copy, every out-of-band buffer is copied into a new
    bytearray first, so that the object owns its memory (numpy arrays come
    back writable, as from an ordinary unpickle); without, the buffers are
    handed to pickle as they are."""
    if not frames:
        raise ValueError("No frames: a pickled object has at least its stream.")
    if copy:
        buffers = [bytearray(f) for f in frames[1:]]
    else:
        buffers = list(frames[1:])
    return pickle.loads(frames[0], buffers=buffers)


def dumps_into(client, key, obj, *, readers=0, wait_ms=None, protocol=DEFAULT_PROTOCOL):
    """Pickle obj (protocol 5, out-of-band buffers) into a new object of the
    client under key, and return its payload offset.

    The payload is in the frames layout: frame 0 the pickle stream, frames
    1..n the out-of-band buffers, each copied once from obj into the
    allocation. readers and wait_ms are as for Client.put(); its errors
    (KeyExists, NoSpace, ObjectTooLarge...) are raised as they are, the
    allocation aborted."""
    return client.put(key, pickle_frames(obj, protocol=protocol), readers=readers,
                      wait_ms=wait_ms)


class _PinKeeper:
    """Releases one pin of a client once every buffer view handed to pickle
    has been garbage-collected. Called from weakref finalizers: it only
    queues the release (Client.release_later), never touching the socket."""

    __slots__ = ("client", "gen", "key", "views", "_gone")

    def __init__(self, client, pin, views):
        self.client = client
        self.gen = pin._gen  # the connection the pin is on: none other is released
        self.key = pin.key
        self.views = views
        self._gone = itertools.count(1)  # next() is atomic: one caller sees the last

    def view_gone(self):
        if next(self._gone) == self.views:
            self.client._release_later_gen(self.gen, self.key)


def loads_from(client, key, *, copy=True):
    """Unpickle the object stored under key by dumps_into().

    copy=True (default): the out-of-band buffers are copied out, the pin is
    released before returning, and the object owns its memory.

    copy=False: zero-copy. The object's out-of-band buffers (numpy arrays'
    data...) are read-only views of the segment, and the pin stays until
    every object made over them has been garbage-collected; the release is
    then sent before the client's next request (Client.release_later). Keep
    the client open meanwhile: closing it drops the pin while the arrays
    still point into the mapping (they stay readable, but their bytes are no
    longer protected). An object with no out-of-band buffer is released at
    once either way.

    Raises NotFound when there is no such object and ProtocolError (the pin
    released) when its payload is not in the frames layout."""
    pin = client.get(key)
    try:
        views = _frames.parse(pin.view)
    except BaseException:
        pin.release(noreply=True)
        raise
    if copy or len(views) == 1:
        try:
            return unpickle_frames(views, copy=True)
        finally:
            del views
            pin.release(noreply=True)
    # pickle receives each view wrapped in a PickleBuffer: a memoryview a
    # consumer makes of it (numpy's frombuffer does) holds the view itself,
    # where one made of a bare memoryview would share only the mapping's
    # buffer and let the view, and so the pin, go too early.
    keeper = _PinKeeper(client, pin, len(views) - 1)
    buffers = []
    for view in views[1:]:
        fin = weakref.finalize(view, keeper.view_gone)
        fin.atexit = False
        buffers.append(pickle.PickleBuffer(view))
    stream = views[0]
    del views, view
    # The daemon pin is the keeper's now: the Pin object goes without it.
    pin._hand_over()
    del pin
    return pickle.loads(stream, buffers=buffers)
