"""The catalog, as this client reads it: the key hash and the validated
copy-out read of proto/catalog.c, in pure Python over the client's mapping.

The daemon publishes a table of key hash -> chunk at the end of the segment
(proto/layout.h, struct shmb_catalog_entry); a read looks the key up there,
copies the payload and checks that the chunk's generation, state and key
bytes did not change under the copy. Nothing in the mapping is trusted: a
read-write client may have scribbled over any of it, so every offset is
checked against bounds from the hello reply, and at worst a read says "ask
the daemon" (AGAIN), never does it return another key's bytes.

Loads of the shared words go through memoryview casts ('I', 'Q'): one
aligned load each on x86-64, whose ordering (TSO) makes every load an
acquire, and CPython does not reorder them. This module knows no socket.
"""

import struct

from . import _protocol as P

__all__ = ["catalog_hash", "Catalog", "HIT", "MISS", "AGAIN", "NOBUFS"]

_M64 = (1 << 64) - 1
_FNV_BASIS = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MIX = 0xD6E8FEB86659FD93

# What Catalog.read found.
HIT = 0     # the copy is exact
MISS = 1    # no committed object has the key (authoritative)
AGAIN = 2   # the catalog cannot say: ask the daemon
NOBUFS = 3  # the caller's buffer is smaller than the payload

# Tries of an entry whose seq is odd (being written), and of the table while
# catalog_moves is odd, before asking the daemon; whole reads redone after a
# change under the copy.
_SPINS = 8
_READ_TRIES = 4
# Keys whose hash is kept; past this the cache starts over (a reader of
# endless distinct keys does not grow without bound).
_CACHE_MAX = 65536
_HEAD = struct.Struct("=IHH")  # magic, state, key_len


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


class Catalog:
    """The catalog of one mapped segment: where it is (from hello), the
    mapping's words, and the hashes of the keys read so far.

    Catalog.make() returns None when hello's figures do not describe a
    catalog inside the mapping (none published, or inconsistent): reads then
    go to the daemon."""

    __slots__ = ("mv", "w32", "w64", "size", "doff", "dend", "coff", "slots", "mask",
                 "seed", "cache")

    @classmethod
    def make(cls, mv, info):
        coff, slots, seed = (info.get(k) for k in ("catalog_offset", "catalog_slots",
                                                   "catalog_seed"))
        size, doff, dsize = len(mv), info["data_offset"], info["data_size"]
        if (not all(type(v) is int for v in (coff, slots, seed))
                or info.get("layout") != P.LAYOUT_VERSION):
            return None
        if (slots <= 0 or slots & (slots - 1) or slots > 1 << 40 or not 0 <= seed < 1 << 32
                or coff % 64 or size % 8 or doff % 64 or coff < doff + dsize
                or coff + slots * P.CATALOG_ENTRY_SIZE > size or doff < P.HEADER_PAGE):
            return None
        return cls(mv, size, doff, doff + dsize, coff, slots, seed)

    def __init__(self, mv, size, doff, dend, coff, slots, seed):
        self.mv = mv
        self.w32 = mv.cast("I")
        self.w64 = mv.cast("Q")
        self.size = size
        self.doff, self.dend = doff, dend
        self.coff, self.slots, self.mask, self.seed = coff, slots, slots - 1, seed
        self.cache = {}

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

    def read(self, found, out=None):
        """Read the key of lookup()'s found. Returns (what, value, gen, flags,
        chunk, retries): what is HIT (value: the bytes, or with out, a
        writable memoryview of bytes, how many were written into it), MISS,
        AGAIN, or NOBUFS (value: the payload's size)."""
        raw, home, tag, hsize = found
        n = len(raw)
        w32, w64, mv = self.w32, self.w64, self.mv
        doff, dend, coff, mask = self.doff, self.dend, self.coff, self.mask
        moves = P.CATALOG_MOVES_AT >> 2
        retries = 0
        for _ in range(_READ_TRIES):
            for _ in range(_SPINS):
                m1 = w32[moves]
                if not m1 & 1:
                    break
            else:
                return AGAIN, None, 0, 0, 0, retries
            changed = False
            for p in range(P.CATALOG_PROBES):
                e = coff + ((home + p) & mask) * P.CATALOG_ENTRY_SIZE
                i, j = e >> 2, e >> 3
                for _ in range(_SPINS):
                    s1 = w32[i]
                    if s1 & 1:
                        continue
                    chunk = w64[j + 1]
                    h, gen, flags, size = w32[i + 1], w32[i + 4], w32[i + 5], w64[j + 3]
                    if w32[i] == s1:
                        break
                else:
                    return AGAIN, None, 0, 0, 0, retries
                if chunk == 0:
                    break  # the end of the probe: a miss
                if h != tag:
                    continue
                if (chunk < doff or chunk % 64 or size <= 0 or chunk + hsize + size > dend
                        or gen == 0):
                    continue
                seal = chunk + P.SEAL_AT
                if w64[seal >> 3] & 0xFFFFFFFF != gen:
                    continue
                _magic, state, key_len = _HEAD.unpack_from(mv, chunk)
                kat = chunk + P.CHUNK_HEADER_SIZE
                if state != P.CHUNK_COMMITTED or key_len != n or mv[kat:kat + n] != raw:
                    continue
                start = chunk + hsize
                if out is None:
                    value = mv[start:start + size].tobytes()
                elif size > len(out):
                    return NOBUFS, size, gen, flags, chunk, retries
                else:
                    out[:size] = mv[start:start + size]
                    value = size
                _magic, state, key_len = _HEAD.unpack_from(mv, chunk)
                if (w64[seal >> 3] & 0xFFFFFFFF == gen and state == P.CHUNK_COMMITTED
                        and key_len == n and mv[kat:kat + n] == raw):
                    return HIT, value, gen, flags, chunk, retries
                retries += 1
                changed = True
                break
            if changed:
                continue
            if w32[moves] != m1:
                continue  # entries moved under the probe: look again
            if w32[P.CATALOG_UNLISTED_AT >> 2] != 0 or not self.same_table():
                return AGAIN, None, 0, 0, 0, retries
            return MISS, None, 0, 0, 0, retries
        return AGAIN, None, 0, 0, 0, retries
