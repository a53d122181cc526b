# SPDX-License-Identifier: Apache-2.0
"""The mapping of a Client: the segment hello passes, mapped and checked
against hello and the segment header, the catalog made from it, the extents
replies name inside its data area, and the chunk headers before payloads.

Client inherits Mapping; the mapping's state stays on the Client (_mmap,
_mv, _map_file, _data_end, _catalog, _seal_base). This module knows the
segment's layout (proto/layout.h through _protocol) and nothing of the
socket: the wire calls _map with hello's reply and descriptors.
"""

import errno as _errno
import mmap
import os

from . import _catalog
from . import _protocol as P
from .errors import ProtocolError, ShmBrokerError

_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def _release_view(view):
    """Release a memoryview unless something still exports it (a numpy array
    made from it): then it stays valid, mapped, until that goes."""
    try:
        view.release()
    except BufferError:
        pass


class Mapping:
    """The segment half of Client: map, check, and read chunk headers."""

    def _map(self, reply, fds):
        """Map the descriptor hello passed, after checking it against hello
        and the segment header."""
        info = {k: v for k, v in reply.items() if k not in ("ok", "id")}
        for field in ("size", "data_offset", "data_size", "max_object_size", "alignment"):
            v = info.get(field)
            if type(v) is not int or v < 0:
                raise ProtocolError("EPROTO", "shmbrokerd's reply lacks a non-negative integer "
                                    "\"%s\"." % field)
        if not fds:
            raise ProtocolError("EPROTO", "shmbrokerd's hello reply carried no segment "
                                "descriptor.")
        fd = fds[0]
        size, doff, dsize = info["size"], info["data_offset"], info["data_size"]
        st = os.fstat(fd)
        if (st.st_size < size or size < P.HEADER_PAGE or doff < P.HEADER_PAGE or doff > size
                or dsize > size - doff):
            raise ProtocolError("EPROTO", "The segment descriptor (%d bytes) does not match "
                                "hello (size %d, data at %d, %d bytes)."
                                % (st.st_size, size, doff, dsize))
        ident = (st.st_dev, st.st_ino, size)
        self._drop_catalog()
        if self._mmap is not None and self._map_file != ident:
            old, self._mmap, self._mv = self._mmap, None, None
            try:
                old.close()
            except BufferError:
                pass
        if self._mmap is None:
            prot = mmap.PROT_READ | (0 if self.read_only else mmap.PROT_WRITE)
            flags = mmap.MAP_SHARED | (_MAP_POPULATE if self.populate else 0)
            try:
                m = mmap.mmap(fd, size, flags=flags, prot=prot)
            except OSError as e:
                raise ShmBrokerError(_errno.errorcode.get(e.errno, "EIO"),
                                     "Cannot map the segment (%d bytes): %s."
                                     % (size, e.strerror)) from None
            self._mmap = m
            self._mv = memoryview(m)
            self._map_file = ident
        head = P.SEGMENT_HEADER.unpack_from(self._mmap, 0)
        magic, version = head[0], head[1]
        if magic != P.SEGMENT_MAGIC:
            raise ProtocolError("EPROTO", "The descriptor shmbrokerd passed is not a shmbroker "
                                "segment: its header starts with 0x%x, not the magic number "
                                "0x%x. Restart shmbrokerd." % (magic, P.SEGMENT_MAGIC))
        if version != P.LAYOUT_VERSION:
            raise ProtocolError("EPROTO", "The segment has layout version %d; this package "
                                "reads version %d. Use a shmbroker package of shmbrokerd's "
                                "release." % (version, P.LAYOUT_VERSION))
        if head[4] != doff or head[5] != dsize:
            raise ProtocolError("EPROTO", "The segment header says data at %d, %d bytes; "
                                "hello said %d, %d bytes." % (head[4], head[5], doff, dsize))
        self.info = info
        self._data_end = doff + dsize
        # The catalog from hello's figures only (none: every read asks).
        self._catalog = _catalog.Catalog.make(self._mv, info)

    def _drop_catalog(self):
        """Let go of the catalog's views of the mapping and of the seal's
        anchor, so that the mapping can be closed or replaced."""
        if self._catalog is not None:
            self._catalog.release()
            self._catalog = None
        self._seal_base = None

    def _extent(self, reply, want=None):
        off, size = reply.get("offset"), reply.get("size")
        if (type(off) is not int or type(size) is not int or off < self.info["data_offset"]
                or size < 0 or off + size > self._data_end or (want is not None and size != want)):
            raise ProtocolError("EPROTO", "shmbrokerd returned extent [%r, +%r) outside the data "
                                "area [%d, %d)." % (off, size, self.info["data_offset"],
                                                    self._data_end))
        return off, size

    def object_header(self, offset, *, committed=False):
        """The chunk header before a payload offset (proto/layout.h, struct
        shmb_chunk_header), checked: returns (chunk_id, key). ProtocolError
        when no valid header ends at offset, or, with committed=True, when
        the chunk is not a committed object's (a deleted or freed one's
        header stays in the segment until the space is reused). Only
        meaningful while the object is pinned."""
        if (type(offset) is not int or offset % P.ALIGN or offset < self.info["data_offset"]
                + P.ALIGN or offset > self._data_end):
            raise ProtocolError("EPROTO", "Offset %r is not a payload offset in the data area "
                                "[%d, %d)." % (offset, self.info["data_offset"],
                                                self._data_end))
        mv = self._mv
        for hs in range(P.ALIGN, P.align64(P.CHUNK_HEADER_SIZE + P.KEY_MAX) + 1, P.ALIGN):
            start = offset - hs
            if start < self.info["data_offset"]:
                break
            h = P.CHUNK_HEADER.unpack_from(mv, start)
            magic, state, key_len, header_size, _tag, chunk_id = h[:6]
            if magic != P.CHUNK_MAGIC or header_size != hs:
                continue
            if key_len > P.KEY_MAX or P.align64(P.CHUNK_HEADER_SIZE + key_len) != hs:
                break
            if committed and state != P.CHUNK_COMMITTED:
                raise ProtocolError("EPROTO", "The chunk before offset %d is not a committed "
                                    "object's (state %d)." % (offset, state))
            raw = bytes(mv[start + P.CHUNK_HEADER_SIZE:start + P.CHUNK_HEADER_SIZE + key_len])
            try:
                return chunk_id, raw.decode("utf-8")
            except UnicodeDecodeError:
                break
        raise ProtocolError("EPROTO", "No valid chunk header (magic 0x%x, header_size, key_len) "
                            "before offset %d." % (P.CHUNK_MAGIC, offset))
