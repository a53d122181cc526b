# SPDX-License-Identifier: Apache-2.0
"""The catalog, as this client reads it: the key hash and the validated
copy-out read of proto/catalog.c, in pure Python over the client's mapping.

The daemon publishes a table of key hash -> chunk at the end of the segment
(proto/layout.h, struct shmb_catalog_entry); a read looks the key up there,
copies the payload and checks that the chunk's generation, state and key
bytes did not change under the copy. Nothing in the mapping is trusted: a
read-write client may have scribbled over any of it, so every offset is
checked against bounds from the hello reply, and at worst a read says "ask
the daemon" (AGAIN), never does it return another key's bytes. Every check
of proto/catalog.c is made here too, in the same order, with the same
outcome (tests/scribble/cases holds both readers to one table).

Loads of the shared words go through memoryview casts ('I', 'Q'): one
aligned load each, as a relaxed atomic load compiles to. Where proto/
catalog.c loads with acquire order (the sequence words, the seal) or puts
an acquire fence (before a sequence word is read again), this reader calls
fence() right after the load, or before the second one: a relaxed load
followed by an acquire fence is an acquire load. On x86-64 (TSO) every load
is already an acquire and CPython does not reorder them, so fence is None
there and costs nothing; elsewhere it is GCC's libatomic
atomic_thread_fence(memory_order_acquire) through ctypes (libatomic.so.1,
where the queues' atomics come from when executable memory is refused).
A 64-bit machine other than x86-64 without libatomic gets no catalog: its
reads ask the daemon (why_no_catalog says so). This module knows no socket.
"""

import ctypes
import functools
import platform
import struct

from . import _protocol as P

__all__ = ["catalog_hash", "Catalog", "HIT", "MISS", "AGAIN", "NOBUFS", "why_no_catalog"]

_M64 = (1 << 64) - 1
_FNV_BASIS = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MIX = 0xD6E8FEB86659FD93

# What Catalog.read found.
HIT = 0     # the copy is exact
MISS = 1    # no committed object has the key (authoritative)
AGAIN = 2   # the catalog cannot say: ask the daemon
NOBUFS = 3  # the caller's buffer is smaller than the payload

_PAYLOAD_SIZE_AT = 32  # struct shmb_chunk_header's payload_size

# As proto/catalog.c: looks at an entry being written (odd seq, or a seq that
# changed under the read), and at the table while catalog_moves is odd or
# changed, before asking the daemon; whole reads redone after the chunk
# changed under the copy, before asking the daemon.
_ENTRY_TRIES = 8
_MOVES_TRIES = 8
_READ_TRIES = 3
# Keys whose hash is kept; past this the cache starts over (a reader of
# endless distinct keys does not grow without bound).
_CACHE_MAX = 65536
_HEAD = struct.Struct("=IHH")  # magic, state, key_len
_ACQUIRE = 2  # memory_order_acquire, __ATOMIC_ACQUIRE


def load_fence(machine=None, library="libatomic.so.1"):
    """(fence, why): the acquire fence this machine's reads of the catalog
    need. fence None and why None: none is needed (x86-64); fence None and
    why a message: no correct read from the mapping here (reads then ask
    the daemon)."""
    machine = (machine or platform.machine()).lower()
    if ctypes.sizeof(ctypes.c_void_p) != 8:
        return None, ("Reads from the mapping need a 64-bit machine (the catalog's 64-bit "
                      "words must load in one piece); this Python is 32-bit, so every read "
                      "asks shmbrokerd.")
    if machine in ("x86_64", "amd64"):
        return None, None
    try:
        lib = ctypes.CDLL(library)
        fence = lib.atomic_thread_fence
    except (OSError, AttributeError):
        return None, ("Reads from the mapping on %s need acquire fences from GCC's "
                      "libatomic (%s with atomic_thread_fence), which is not installed, so "
                      "every read asks shmbrokerd (one round trip). Install it (Debian: "
                      "apt install libatomic1) for reads without a round trip."
                      % (machine or "this machine", library))
    fence.restype = None
    fence.argtypes = (ctypes.c_int,)
    # A few instructions: call it without letting go of the GIL.
    call = ctypes.PYFUNCTYPE(None, ctypes.c_int)(ctypes.cast(fence, ctypes.c_void_p).value)
    acquire_fence = functools.partial(call, _ACQUIRE)
    acquire_fence.library = lib  # loaded while the fence lives
    return acquire_fence, None


# The fence of this machine, loaded on first use (x86-64 loads nothing).
_fence = None
why_no_catalog = None
_loaded = False


def machine_fence():
    """load_fence() of this machine, once per process."""
    global _fence, why_no_catalog, _loaded
    if not _loaded:
        _fence, why_no_catalog = load_fence()
        _loaded = True
    return _fence, why_no_catalog


def catalog_hash(seed, key):
    """shmb_catalog_hash: FNV-1a 64 over key (bytes) with seed xor'ed into
    the offset basis, then the final mix. The home slot is h & (slots - 1),
    the entry keeps h >> 32."""
    h = _FNV_BASIS ^ (seed & 0xFFFFFFFF)
    for b in key:
        h = ((h ^ b) * _FNV_PRIME) & _M64
    h ^= h >> 32
    h = (h * _MIX) & _M64
    return h ^ (h >> 32)


_MACHINE = object()  # Catalog.make's default: this machine's fence


class Catalog:
    """The catalog of one mapped segment: where it is (from hello), the
    mapping's words, and the hashes of the keys read so far.

    Catalog.make() returns None when hello's figures do not describe a
    catalog inside the mapping (none published, or inconsistent), or when
    this machine cannot read it correctly (why_no_catalog): reads then go
    to the daemon."""

    __slots__ = ("mv", "w32", "w64", "size", "doff", "dend", "coff", "slots", "mask",
                 "seed", "cache", "fence")

    @classmethod
    def make(cls, mv, info, fence=_MACHINE):
        """fence: the acquire fence to call (None: none needed), by default
        this machine's (machine_fence())."""
        if fence is _MACHINE:
            fence, why = machine_fence()
            if why is not None:
                return None
        coff, slots, seed = (info.get(k) for k in ("catalog_offset", "catalog_slots",
                                                   "catalog_seed"))
        size, doff, dsize = len(mv), info["data_offset"], info["data_size"]
        if (not all(type(v) is int for v in (coff, slots, seed, doff, dsize))
                or info.get("layout") != P.LAYOUT_VERSION):
            return None
        if (slots <= 0 or slots & (slots - 1) or slots > 1 << 40 or not 0 <= seed < 1 << 32
                or coff % 64 or size % 8 or doff % 64 or dsize < 0 or coff < doff + dsize
                or coff + slots * P.CATALOG_ENTRY_SIZE > size or doff < P.HEADER_PAGE):
            return None
        return cls(mv, size, doff, doff + dsize, coff, slots, seed, fence)

    def __init__(self, mv, size, doff, dend, coff, slots, seed, fence=None):
        self.mv = mv
        self.w32 = mv.cast("I")
        self.w64 = mv.cast("Q")
        self.size = size
        self.doff, self.dend = doff, dend
        self.coff, self.slots, self.mask, self.seed = coff, slots, slots - 1, seed
        self.cache = {}
        self.fence = fence

    def release(self):
        """Let go of the mapping's views (before it is unmapped)."""
        for v in (self.w32, self.w64):
            try:
                v.release()
            except BufferError:
                pass

    def same_table(self):
        """Whether the header page still describes the table hello gave (a
        daemon restarted on the segment may have laid out another: then a
        miss in ours proves nothing)."""
        w32, w64 = self.w32, self.w64
        return (w32[P.CATALOG_SEED_AT >> 2] == self.seed
                and w64[P.CATALOG_SLOTS_AT >> 3] == self.slots
                and w64[P.CATALOG_OFFSET_AT >> 3] == self.coff)

    def lookup(self, key, raw):
        """(raw, home, tag, header bytes) of key (a str; raw its UTF-8),
        cached."""
        found = self.cache.get(key)
        if found is None:
            if len(self.cache) >= _CACHE_MAX:
                self.cache.clear()
            h = catalog_hash(self.seed, raw)
            found = self.cache[key] = (raw, h & self.mask, h >> 32,
                                       P.align64(P.CHUNK_HEADER_SIZE + len(raw)))
        return found

    def absent(self, raw):
        """Whether no committed object has the key raw (its UTF-8), proven
        as read() proves a miss, from the key's home entry alone: True when
        that entry is empty while catalog_moves was even and unchanged, no
        object is unlisted and the table is hello's. False when it cannot
        be proven so (the home entry holds an entry, anything moved):
        read() says then. The hash is not cached: a put's look for another
        writer's object of a new key is the only look at that key."""
        if len(raw) > P.KEY_MAX:
            return False
        w32, fence = self.w32, self.fence
        moves_at = P.CATALOG_MOVES_AT >> 2
        m1 = w32[moves_at]
        if fence is not None:
            fence()
        if m1 & 1:
            return False
        e = self.coff + (catalog_hash(self.seed, raw) & self.mask) * 32
        s1 = w32[e >> 2]
        if fence is not None:
            fence()
        if s1 & 1 or self.w64[(e >> 3) + 1] != 0:
            return False
        if fence is not None:
            fence()
        if w32[e >> 2] != s1 or w32[moves_at] != m1:
            return False
        unlisted = w32[P.CATALOG_UNLISTED_AT >> 2]
        if fence is not None:
            fence()
        return unlisted == 0 and self.same_table()

    def read(self, found, out=None):
        """Read the key of lookup()'s found, as shmb_catalog_read does, with
        every check of proto/catalog.c in its order. Returns (what, value,
        gen, flags, chunk, retries): what is HIT (value: the bytes, or with
        out, a writable memoryview of bytes, how many were written into
        it), MISS, AGAIN, or NOBUFS (value: the payload's size)."""
        raw, home, tag, hsize = found
        n = len(raw)
        w32, w64, mv, fence = self.w32, self.w64, self.mv, self.fence
        doff, dend, coff, mask = self.doff, self.dend, self.coff, self.mask
        moves_at = P.CATALOG_MOVES_AT >> 2
        probes = P.CATALOG_PROBES if P.CATALOG_PROBES <= mask else mask + 1
        retries = copies = moves = 0
        if n > P.KEY_MAX:
            return AGAIN, None, 0, 0, 0, retries
        while copies <= _READ_TRIES and moves <= _MOVES_TRIES:
            m1 = w32[moves_at]
            if fence is not None:
                fence()
            if m1 & 1:
                moves += 1
                continue
            # One probe from key's home (catalog_pass): ends in a return, a
            # break after the chunk changed under the copy (read again), or
            # an empty entry past no entry of key's tag that failed its
            # checks (a miss, proven below).
            suspect = changed = False
            for p in range(probes):
                e = coff + ((home + p) & mask) * 32
                i, j = e >> 2, e >> 3
                for _ in range(_ENTRY_TRIES):
                    s1 = w32[i]
                    if fence is not None:
                        fence()
                    if s1 & 1:
                        continue
                    h, chunk, gen, flags, size = (w32[i + 1], w64[j + 1], w32[i + 4],
                                                  w32[i + 5], w64[j + 3])
                    if fence is not None:
                        fence()
                    if w32[i] == s1:
                        break
                else:
                    return AGAIN, None, 0, 0, 0, retries
                if chunk == 0:
                    if suspect:
                        return AGAIN, None, 0, 0, 0, retries
                    break
                if h != tag:
                    continue
                # From here on, an entry that fails a check makes a miss
                # unsure: it may be key's own, changed under the read or
                # scribbled over, and only the daemon knows.
                suspect = True
                # Bounds, from hello's figures only: the chunk, its header
                # and payload lie inside the data area.
                if (chunk < doff or chunk & 63 or size == 0 or chunk > dend
                        or hsize > dend - chunk or size > dend - chunk - hsize or gen == 0):
                    continue
                # The chunk holds key, committed, sealed with gen, size bytes.
                seal = (chunk + P.SEAL_AT) >> 3
                sealed = w64[seal]
                if fence is not None:
                    fence()
                if sealed & 0xFFFFFFFF != gen:
                    continue
                magic, state, key_len = _HEAD.unpack_from(mv, chunk)
                kat = chunk + P.CHUNK_HEADER_SIZE
                if (magic != P.CHUNK_MAGIC or state != P.CHUNK_COMMITTED or key_len != n
                        or w64[(chunk + _PAYLOAD_SIZE_AT) >> 3] != size
                        or mv[kat:kat + n] != raw):
                    continue
                start = chunk + hsize
                if out is None:
                    value = mv[start:start + size].tobytes()
                elif size > len(out):
                    return NOBUFS, size, gen, flags, chunk, retries
                else:
                    out[:size] = mv[start:start + size]
                    value = size
                # After the copy: the chunk still has gen, COMMITTED and key,
                # so what was copied is what was committed under key.
                if fence is not None:
                    fence()
                sealed = w64[seal]
                if fence is not None:
                    fence()  # C loads this seal with acquire order too
                if (sealed & 0xFFFFFFFF == gen
                        and _HEAD.unpack_from(mv, chunk)[1] == P.CHUNK_COMMITTED
                        and mv[kat:kat + n] == raw):
                    return HIT, value, gen, flags, chunk, retries
                changed = True
                break
            else:
                # The probe ran its length without an empty entry: an entry
                # is never further from its home, but a table this full is
                # not worth trusting.
                return AGAIN, None, 0, 0, 0, retries
            if changed:
                copies += 1
                retries += 1
                continue
            # A miss proves something only if no entry moved during the
            # probe (a deletion shifts entries back, past a reader) and the
            # catalog lists every committed object.
            if fence is not None:
                fence()
            if w32[moves_at] != m1:
                moves += 1
                continue
            unlisted = w32[P.CATALOG_UNLISTED_AT >> 2]
            if fence is not None:
                fence()
            if unlisted != 0 or not self.same_table():
                return AGAIN, None, 0, 0, 0, retries
            return MISS, None, 0, 0, 0, retries
        return AGAIN, None, 0, 0, 0, retries
