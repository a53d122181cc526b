# SPDX-License-Identifier: Apache-2.0
"""The protocol's tables and the segment's layout, as the Python client sees them.

These mirror proto/ops.def, proto/errors.def, proto/stats.def, proto/protocol.h
and proto/layout.h, which stay the single source: tests/python/test_tables.py
parses those files and fails on any difference from what is written here.
Nothing in this module talks to a socket.
"""

import struct

PROTOCOL_VERSION = 1
DEFAULT_SOCKET = "/run/shmbroker/shmbroker.sock"
# A user who cannot write /run/shmbroker gets a private directory: this one
# under $XDG_RUNTIME_DIR, else USER_SOCKET_TMP with its uid.
USER_SOCKET_DIR = "shmbroker"
USER_SOCKET_TMP = "/tmp/shmbroker-"
USER_SOCKET_NAME = "shmbroker.sock"
SOCKET_ENV = "SHMBROKER_SOCKET"

# A request line holds at most this many bytes before its newline; the daemon
# closes the connection on a longer one (SHMB_MAX_LINE).
MAX_LINE = 64 * 1024
# The library gives up on a reply longer than this (SHMB_MAX_REPLY).
MAX_REPLY = 64 * 1024 * 1024
# A pool's name is 1 to this many of NAME_CHARS (proto/names.h, the daemon's
# --pool; shmb_set_pool refuses a longer one too).
POOL_NAME_MAX = 32
NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
# A queue's name follows a pool's rule (SHMB_QUEUE_NAME_LEN_MAX).
QUEUE_NAME_MAX = POOL_NAME_MAX
# A queue message too long for its slot goes as the store object
# QUEUE_KEY_PREFIX + "<queue>/<seq>" of the connection's pool.
QUEUE_KEY_PREFIX = "q/"
# Ops in one batch line (COMMAND_MAX_BATCH in the daemon, SHMB_MAX_BATCH in
# the library).
MAX_BATCH = 4096
# put_many allocates at most this many objects per line before committing
# them: the daemon's default --max-pending.
PUT_CHUNK = 1024

# Op flags, as enum shmb_op_flag in proto/protocol.h.
OPF_WRITES = 1 << 0
OPF_NOREPLY = 1 << 1
OPF_BATCH = 1 << 2

# proto/ops.def, in its order: name -> flags.
OPS = {
    "hello": 0,
    "alloc": OPF_WRITES | OPF_BATCH,
    "commit": OPF_WRITES | OPF_NOREPLY | OPF_BATCH,
    "abort": OPF_WRITES | OPF_NOREPLY | OPF_BATCH,
    "get": OPF_BATCH,
    "release": OPF_NOREPLY | OPF_BATCH,
    "touch": OPF_WRITES | OPF_NOREPLY | OPF_BATCH,
    "delete": OPF_WRITES | OPF_NOREPLY | OPF_BATCH,
    "contains": OPF_BATCH,
    "list": 0,
    "stats": 0,
    "clients": 0,
    "batch": 0,
    "queue_create": OPF_WRITES,
    "queue_open": OPF_WRITES,
    "queue_close": 0,
    "queue_shutdown": OPF_WRITES,
    "queue_delete": OPF_WRITES,
    "queue_list": 0,
    "read": OPF_NOREPLY | OPF_BATCH,
    "arena": OPF_WRITES,
    "commit_at": OPF_WRITES | OPF_NOREPLY | OPF_BATCH,
}

# proto/errors.def: codes the daemon sends, then codes the library reports on
# its own side.
WIRE_ERRORS = (
    "EPROTO", "EINVAL", "ENOSYS", "EPERM", "EEXIST", "ENOENT", "E2BIG", "ENOSPC",
    "ETIMEDOUT", "EDQUOT", "EMSGSIZE", "EMFILE", "ENOMEM", "EIO", "EBUSY", "ECANCELED",
    "ESTALE",
)
LIBRARY_ERRORS = (
    "ECONNREFUSED", "ECONNRESET", "EPIPE", "EBADMSG", "EAGAIN", "ENOTCONN",
)

# proto/stats.def: the fields of a stats reply, in order, and the counters
# (inside "counters").
STATS_FIELDS = (
    "segment", "size", "data_size", "used", "free", "objects", "pending", "pinned",
    "clients", "max_object_size", "uptime_s", "pid", "version", "shm_dir",
    "shm_dir_free", "blocker",
)
STATS_COUNTERS = (
    "allocs", "commits", "gets", "evictions", "enospc", "expired_allocs",
    "lease_expiries", "noreply_errors", "fast_reads",
)

# proto/layout.h.
SEGMENT_MAGIC = 0x31474553424D4853  # "SHMBSEG1"
LAYOUT_VERSION = 2
HEADER_PAGE = 4096
ALIGN = 64
KEY_MAX = 255


def _layout(fmt, names):
    """A struct of proto/layout.h: its struct.Struct (host byte order, as the
    daemon writes it, no padding) and (name, offset) for each member, the
    offsets from the format (tests/python/test_tables.py checks them against
    layout.h's asserted ones)."""
    names = names.split()
    if len(names) != len(fmt) - 1:
        raise ValueError("%d names for the %d members of %s" % (len(names), len(fmt) - 1, fmt))
    return struct.Struct(fmt), tuple((n, struct.calcsize(fmt[:i + 1]))
                                     for i, n in enumerate(names))


# struct shmb_segment_header: up to ring_next_id, then layout 2's catalog and
# heartbeat words.
SEGMENT_HEADER, SEGMENT_HEADER_FIELDS = _layout(
    "=QIIQQQqQQQQQQQIIIIQQII",
    "magic version header_size total_size data_offset data_size owner_pid owner_start "
    "created_unix ring_start ring_end ring_next_id catalog_offset catalog_slots catalog_seed "
    "catalog_moves catalog_unlisted gen_next heartbeat_unix_ms heartbeat_count "
    "heartbeat_period_ms retired")
SEGMENT_HEADER_SIZE = 144
# Where the catalog's words of the header are, for the reader's loads.
CATALOG_MOVES_AT = 108
CATALOG_UNLISTED_AT = 112
CATALOG_OFFSET_AT = 88
CATALOG_SLOTS_AT = 96
CATALOG_SEED_AT = 104
# Not 0 once the daemon has given the segment up (SEGMENT_RETIRED): reads
# then ask the daemon instead of answering from the mapping.
SEGMENT_RETIRED_AT = 140
SEGMENT_RETIRED = 0x44524954

# struct shmb_published_counters, at COUNTERS_AT in the header page.
COUNTERS_AT = 256
PUBLISHED_COUNTERS, PUBLISHED_COUNTERS_FIELDS = _layout(
    "=IIQQQQQQQQQQQQQQQQq",
    "seq clients data_size used free objects pending pinned arenas arena_bytes allocs commits "
    "gets evictions enospc expired_allocs lease_expiries fast_reads pid")
PUBLISHED_COUNTERS_SIZE = 144

CHUNK_MAGIC = 0x4B4E4843  # "CHNK"
CHUNK_GAP = 1
CHUNK_PENDING = 2
CHUNK_COMMITTED = 3
CHUNK_FREE = 4
CHUNK_ARENA = 5
CHUNK_WRITTEN = 6  # published in its arena by its client, not folded yet
# struct shmb_chunk_header; the key's bytes follow.
CHUNK_HEADER, CHUNK_HEADER_FIELDS = _layout(
    "=IHHIIQQQQ", "magic state key_len header_size tag id chunk_size payload_size seal")
CHUNK_HEADER_SIZE = 48
SEAL_AT = 40  # the seal: low 32 bits the generation, high 32 a count

# struct shmb_catalog_entry: hash is the key hash's high 32 bits, chunk 0
# an empty entry.
CATALOG_ENTRY, CATALOG_ENTRY_FIELDS = _layout("=IIQIIQ", "seq hash chunk gen flags size")
CATALOG_ENTRY_SIZE = 32
CATALOG_AWAITED = 1
CATALOG_PROBES = 32


def align64(n):
    """n rounded up to a multiple of ALIGN."""
    return (n + ALIGN - 1) & ~(ALIGN - 1)
