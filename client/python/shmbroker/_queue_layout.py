# SPDX-License-Identifier: Apache-2.0
"""The layout of a queue's area (proto/layout_queue.h): its constants and
offsets, its size for a geometry, and the errors a queue's calls raise when
the area is corrupt, shut down or closed under them.

The area (_queue_area, _queue_wait), the messages' encoding (_queue_codec)
and MessageQueue (queue) share it; it knows nothing of waits, messages or
the daemon. queue.py re-exports every name, where tests and callers find
them.
"""

import struct

from .errors import Cancelled, ConnectionLost, ShmBrokerError

# proto/layout_queue.h (tests/python/test_queues.py checks these against it).
QUEUE_MAGIC = 0x31455551424D4853  # "SHMBQUE1"
QUEUE_VERSION = 1
SEATS_MAX = 64
SLOTS_MIN, SLOTS_MAX = 2, 65536
SLOT_SIZE_MIN, SLOT_SIZE_MAX = 64, 1 << 30
NAME_MAX = 64
SLOT_HEADER = 64
SEAT_SIZE = 64
HEADER_PAGE = 4096
ALIGN = 64
# Byte offsets of struct shmb_queue_header's fields.
HEADER_OFFSETS = {
    "magic": 0, "version": 8, "seats": 12, "slots": 16, "slot_size": 24,
    "slot_stride": 32, "slots_offset": 40, "total_size": 48, "name": 56, "head": 128,
    "head_word": 192, "readers_waiting": 196, "free_word": 256, "writer_waiting": 260,
    "wake_at": 264, "state": 320, "writer_live": 324, "writer_epoch": 328,
}
SEAT_OFFSETS = {"next": 0, "state": 8, "waiting": 12, "epoch": 16}
SLOT_OFFSETS = {"seq": 0, "flags": 8, "len": 12, "aux": 16, "aux2": 24}
# struct shmb_queue_slot's fields in order (host order, as the C members write).
SLOT = struct.Struct("=QIIQQ")
_GEOMETRY = struct.Struct("=QIIQQQQQ")  # magic .. total_size

QUEUE_OPEN, QUEUE_SHUTDOWN, QUEUE_WRITER_GONE = 0, 1, 2
SEAT_FREE, SEAT_LIVE, SEAT_DEAD = 0, 1, 2
SLOT_INLINE, SLOT_OBJECT = 1, 2

_H = HEADER_OFFSETS


def _round_up(v, to):
    return (v + to - 1) // to * to


def _slots_offset_for(seats):
    return _round_up(HEADER_PAGE + seats * SEAT_SIZE, HEADER_PAGE)


def queue_size(seats, slots, slot_size):
    """Bytes of a queue's area for this geometry (shmb_q_size), or 0 when
    the geometry is out of range."""
    if not (1 <= seats <= SEATS_MAX and SLOTS_MIN <= slots <= SLOTS_MAX
            and SLOT_SIZE_MIN <= slot_size <= SLOT_SIZE_MAX):
        return 0
    return _slots_offset_for(seats) + slots * _round_up(SLOT_HEADER + slot_size, ALIGN)


def _corrupt(why):
    return ShmBrokerError("EIO", "The queue's area is corrupt: %s." % why)


def _cancelled():
    return Cancelled("ECANCELED", "cancelled: the queue was shut down.")


def _stopped_here(why):
    return Cancelled("ECANCELED", "cancelled: %s; the queue itself goes on for its other "
                     "members." % why)



def _closed_meanwhile():
    return ConnectionLost("ENOTCONN", "This MessageQueue was closed (by another thread) while "
                          "this call was in it; nothing more was read or written.")
