# SPDX-License-Identifier: Apache-2.0
"""The arena's puts of a Client: put_nowait() and sync(), the put through
the arena (_put_arena) with its commit_at line, the reply that grants an
arena, the record of puts sent without waiting that the daemon refused, and
the put by alloc, copy and commit when there is no arena to be had.

Client inherits Puts; the state stays on the Client (_arena, arena_want,
_unconfirmed, _lost_puts, _replies, _seal_base). The arena's mechanics (its
lock, cursor and layout) are _arena.py's; the socket and the line exchange
the wire's (_wire.py). Also the payload helpers put() and put_many() share:
_prepare, _write, and _json_key for lines built by hand.
"""

import json
import operator

from . import _arena
from . import _protocol as P
from . import frames as _frames
from ._keys import check_key
from ._wire import _reply_error
from .errors import Cancelled, ConnectionLost, InvalidRequest, ProtocolError
from .errors import ShmBrokerError, Unsupported

_READERS_MAX = 1000000  # the awaited reads one request may ask for (PROTOCOL.md)


class Puts:
    """The arena half of Client's writes: put_nowait, sync, and the put
    through the arena that put() of the vLLM store drop-in uses."""

    # (key, payload offset, chunk id) of the last chunk _publish published:
    # the store drop-in records an object whose put was cut short after it.
    _published = None

    def put_nowait(self, key, data, *, readers=0):
        """Store an object without waiting for the daemon: the payload is
        copied into this connection's arena and its commit_at sent with
        "noreply" (shmb_put_nowait). Returns the payload's offset. The
        object is visible to every client once any later request of this
        client has been answered (sync() is one); this client's read() of
        it finds it before that (it waits read_wait for the commit, then
        asks the daemon).

        A put sent so that the daemon refused it (its key taken, say) is
        reported by the next put_nowait() or sync(): Cancelled (ECANCELED)
        naming the first one's key, its error and how many; the put that
        reports it is not made (put again what was lost, then it). Without
        an arena (a read-only client, arena_want 0, a daemon that gives
        none, an object larger than an arena may be) Unsupported (ENOSYS);
        a daemon short of room for an arena: the put goes through alloc and
        commit and waits. Other errors as put()'s."""
        part, total = _prepare(data)
        key = check_key(key)
        return self._put_arena(key, part, total, readers, True)[0]

    def sync(self):
        """Wait until every put sent without waiting has been handled, and
        raise Cancelled for those the daemon refused (or that may be lost
        with a connection), as put_nowait() would (shmb_sync)."""
        if self._unconfirmed[0] > 0 and self._sock is not None:
            try:
                self.contains(self._unconfirmed[1])
            except ConnectionLost:
                if self._lost_puts[0] == 0:
                    raise
        self._report_lost(None)

    def _report_lost(self, key):
        """Raise Cancelled for the recorded refusals (and forget them); the
        arena is dropped: a commit refused other than for its key leaves the
        daemon's cursor behind this client's."""
        n, lost_key, code, message = self._lost_puts
        if n == 0:
            return
        self._lost_puts = [0, None, None, None]
        self._arena.drop()
        more = ", and %d more after it" % (n - 1) if n > 1 else ""
        then = "This put of '%s' was not made: " % key if key is not None else ""
        if code == "ECONNRESET":
            raise Cancelled("ECANCELED", "A put sent without waiting (put_nowait) of '%s' may "
                            "not have been made: %s%s. %s%sook for what may be lost (contains) "
                            "and put it again%s." % (lost_key, message, more, then,
                                                     "l" if key is not None else "L",
                                                     ", then this" if key is not None else ""))
        raise Cancelled("ECANCELED", "A put sent without waiting (put_nowait) of '%s' was "
                        "refused by shmbrokerd (%s: %.400s)%s. %s%sut again what was lost%s."
                        % (lost_key, code, message, more, then,
                           "p" if key is not None else "P",
                           ", then this" if key is not None else ""))

    def _arena_base(self):
        """The mapping's address, for the arena's atomics (None without them)."""
        seal = self._seal_base
        if seal is not None:
            return seal[1], seal[2]
        from . import _futex  # its executable page only for clients that use it
        if not _futex.supported:
            return None, None
        anchor = _futex.anchor(self._mmap)
        self._seal_base = (anchor, _futex.address(anchor), _futex.cas64)
        return self._seal_base[1], _futex.cas64

    def _arena_why(self):
        """Why this client puts without an arena, or None."""
        if self.read_only:
            return "this client is read-only"
        if self.arena_want == 0:
            return "arenas are off (arena_want is 0)"
        if self._arena.off:
            return ("shmbrokerd gives this connection no arena (an older daemon, or a segment "
                    "too small for one)")
        return None

    def _arena_reply(self, want):
        """Read the reply to the arena request of id want and hold what it
        granted; raises the daemon's error (ENOSPC: the next few puts do not
        ask again; EPERM, EINVAL, ENOSYS: this connection asks no more)."""
        arena = self._arena
        arena.drop()
        reply = self._exchange_line_reply(want)
        if reply.get("ok") is not True:
            err = _reply_error(reply)
            if err.code in ("ENOSYS", "EPERM", "EINVAL"):
                arena.off = True
            elif err.code == "ENOSPC":
                arena.skip = _arena.SKIP
            raise err
        if not arena.take(reply, self.info, self._mv):
            raise ProtocolError("EPROTO", "shmbrokerd granted an arena %.160r outside the data "
                                "area [%d, +%d), or without a lock token; puts on this "
                                "connection go without one." % (reply, self.info["data_offset"],
                                                                self.info["data_size"]))

    def _take_due_arena(self, quiet=True):
        """Read the reply to the arena request that a put's commit sent
        without waiting for it (_commit_at) and hold what it granted: the
        daemon answered it while the caller went on, so this reads a line
        that is mostly there already. Called before any later reply is read,
        which comes after it. A refusal is recorded as _arena_reply records
        it; quiet: not raised (the put that needs an arena asks again or goes
        through alloc and commit), unless the connection went."""
        due, self._arena_due = self._arena_due, None
        try:
            self._arena_reply(due)
        except ShmBrokerError:
            if not quiet or self._sock is None:
                raise
        except BaseException:
            # Interrupted part way through the line: the next reply would
            # meet its rest, so the connection goes (reconnect() to go on).
            self._disconnect(keep_map=True)
            raise

    def _put_arena(self, key, part, total, readers, nowait, write=None, before_commit=None,
                   publish=False):
        """A put through the arena: (payload offset, chunk id; None when
        the put went through alloc and commit, whose chunk header holds it).
        Without an arena (nowait: Unsupported unless only room was short)
        the put goes through alloc and commit. Raises Cancelled first when
        puts sent without waiting were refused. write(view, part) copies
        part (default: as put() does); before_commit(offset, chunk id or
        None) is called once the payload is in place, before its commit is
        sent (a writer killed after it may leave the object). publish (with
        nowait): the chunk is published in the arena (_publish), nothing
        sent for it."""
        write = write or _write
        key = check_key(key)
        readers = operator.index(readers)
        if not 0 <= readers <= _READERS_MAX:
            raise InvalidRequest("EINVAL", "readers is %d: an object awaits 0 to %d reads. "
                                 "Nothing was sent." % (readers, _READERS_MAX))
        if self._lost_puts[0]:
            self._report_lost(key)
        why = self._arena_why()
        base, cas64 = (None, None) if why else self._arena_base()
        if why is None and base is None:
            why = "this machine has no 64-bit compare-and-swap for the arena's lock"
        if why is not None:
            if nowait:
                raise Unsupported("ENOSYS", "put_nowait needs an arena, and %s. Nothing was "
                                  "sent; use put()." % why)
            return self._put_copy(key, part, total, readers, write, before_commit)
        arena = self._arena
        raw = key.encode("utf-8", "surrogatepass")
        hsize = P.align64(P.CHUNK_HEADER_SIZE + len(raw))
        chunk = hsize + P.align64(total)
        if total == 0 or chunk > arena.limit(self.info):
            return self._put_copy(key, part, total, readers, write, before_commit)
        if arena.skip > 0 and arena.size == 0:
            arena.skip -= 1
            return self._put_copy(key, part, total, readers, write, before_commit)
        self._enter()
        try:
            for _attempt in range(2):
                if not arena.room(chunk):
                    try:
                        if self._arena_due is not None:
                            # Asked for with the last commit: mostly answered by now.
                            self._take_due_arena(quiet=False)
                        if not arena.room(chunk):
                            want = self._next_id()
                            out = self._pending_lines() if self._later else []
                            out.append(b'{"op":"arena","id":%d,"size":%d}\n'
                                       % (want, arena.ask(self.info, chunk, self.arena_want,
                                                          _arena.PUBLISH_RUN if publish else 4)))
                            self._send(b"".join(out))
                            self._arena_reply(want)
                    except ShmBrokerError as e:
                        if self._sock is None:
                            raise
                        if nowait and arena.off:
                            raise Unsupported("ENOSYS", "put_nowait needs an arena, and %s (%s). "
                                              "Nothing was sent; use put()."
                                              % (self._arena_why(), e.message)) from None
                        break
                    if chunk > arena.size:
                        break
                if publish and nowait:
                    done = self._publish(key, raw, hsize, part, total, readers, chunk, write,
                                         before_commit, base, cas64)
                    if done is not None:
                        return done
                    continue
                if not arena.write(base, cas64, hsize, part, total,
                                   lambda at, n: self._mv[at:at + n], write):
                    continue
                if before_commit is not None:
                    try:
                        before_commit(arena.cursor + hsize, arena.chunk_id)
                    except BaseException:
                        arena.count(base, cas64, -1)
                        raise
                done = self._commit_at(key, hsize, total, readers, chunk, nowait)
                if done is not None:
                    return done
        finally:
            self._busy.release()
        # Taken back twice in a row (the daemon is short of room), or no
        # arena to be had: alloc and commit.
        return self._put_copy(key, part, total, readers, write, before_commit)

    def _publish_held(self, key, part, total, readers, write):
        """The publishing put_nowait of _put_arena in its usual case: the
        arena held has room for the chunk, no refused put is waiting to be
        reported, the arena's atomics are loaded. (payload offset, chunk
        id), or None when that case does not hold or the arena went before
        the publish: nothing was done, make the put through _put_arena. key
        was checked (check_key) by the caller; nothing is told before the
        publish (no before_commit)."""
        arena = self._arena
        seal = self._seal_base
        if (seal is None or arena.size == 0 or self._lost_puts[0] or total <= 0
                or type(readers) is not int or not 0 <= readers <= _READERS_MAX
                or not self.arena_want):
            return None
        raw = key.encode("utf-8", "surrogatepass")
        hsize = (P.CHUNK_HEADER_SIZE + len(raw) + P.ALIGN - 1) & ~(P.ALIGN - 1)
        chunk = hsize + ((total + P.ALIGN - 1) & ~(P.ALIGN - 1))
        if not arena.room(chunk):
            return None
        self._enter()
        try:
            return self._publish(key, raw, hsize, part, total, readers, chunk, write, None,
                                 seal[1], seal[2])
        finally:
            self._busy.release()

    def _publish(self, key, raw, hsize, part, total, readers, chunk, write, before_commit, base,
                 cas64):
        """Publish the chunk of key (raw: its UTF-8) at the arena's cursor
        (Arena.publish): (payload
        offset, chunk id), or None when the arena went before (nothing
        published; the caller lays it out again). Nothing is sent for it:
        the daemon folds it before it handles this client's next request
        (or anyone's on the pool), and tells a refusal with the next reply,
        as for a noreply commit_at. When it leaves the arena low, the next
        arena is asked for now (sent, its reply read when needed). Called
        holding the client's lock."""
        arena = self._arena
        at, chunk_id = arena.cursor, arena.chunk_id
        if before_commit is not None:
            # Told first: a writer killed after the publish leaves the
            # object; one killed before leaves nothing (the guard finds no
            # object there).
            before_commit(at + hsize, chunk_id)
        refill = arena.refill(chunk)
        if not arena.publish(base, cas64, self._mv, raw, hsize, part, total, readers,
                             write):
            return None
        # First: a caller whose put is cut short from here on (an exception,
        # KeyboardInterrupt) still learns where its object went.
        self._published = (key, at + hsize, chunk_id)
        if self._unconfirmed[0] == 0:
            self._unconfirmed[1] = key
        self._unconfirmed[0] += 1
        if refill:
            aid = self._next_id()
            out = self._pending_lines() if self._later else []
            out.append(b'{"op":"arena","id":%d,"size":%d}\n'
                       % (aid, arena.ask(self.info, chunk, self.arena_want, _arena.PUBLISH_RUN)))
            self._send(b"".join(out))
            arena.drop()
            self._arena_due = aid
        return at + hsize, chunk_id

    def _commit_at(self, key, hsize, total, readers, chunk, nowait):
        """Send the commit_at of the chunk laid out at the arena's cursor
        (with the next arena's request when this one runs low): (payload
        offset, chunk id), or None when the arena went under it (the caller
        lays the chunk out again). Called holding the client's lock."""
        arena = self._arena
        at = arena.cursor
        chunk_id = arena.chunk_id
        refill = arena.refill(chunk)
        cid = self._next_id()
        # Built here, not through the JSON encoder: the key was checked, the
        # numbers are integers (the put's hottest line, as client/arena.c's).
        try:
            line = (b'{"op":"commit_at","id":%d,"key":%s,"offset":%d,"size":%d,'
                    b'"readers":%d%s}\n' % (cid, _json_key(key), at, total,
                                             operator.index(readers),
                                             b',"noreply":true' if nowait else b""))
        except BaseException:
            arena.count(self._seal_base[1], self._arena_base()[1], -1)
            raise
        out = self._pending_lines() if self._later else []
        out.append(line)
        aid = None
        if refill:
            aid = self._next_id()
            out.append(b'{"op":"arena","id":%d,"size":%d}\n'
                       % (aid, arena.ask(self.info, chunk, self.arena_want)))
        self._send(b"".join(out))
        unsure = self._unconfirmed[0] > 0
        err = None
        if nowait:
            if self._unconfirmed[0] == 0:
                self._unconfirmed[1] = key
            self._unconfirmed[0] += 1
            # read() of it waits for its commit, this chunk (Reads).
            self._landing, self._landing_at = key, at
            arena.cursor += chunk
        else:
            reply = self._exchange_line_reply(cid)
            if reply.get("ok") is True:
                arena.cursor += chunk
                if reply.get("offset") != at + hsize:
                    err = ProtocolError("EPROTO", "shmbrokerd committed '%s' at %r; the client "
                                        "laid its payload out at %d." % (key, reply.get("offset"),
                                                                         at + hsize))
            else:
                err = _reply_error(reply)
                if err.code == "EEXIST":
                    arena.cursor += chunk  # stepped over by the daemon as well
                elif err.code == "ESTALE" or unsure:
                    arena.drop()
        if refill and nowait:
            # Its reply is read when the next put needs the arena, or before
            # any other reply: this put waits for nothing. The arena held
            # goes now, as the daemon gives it back on granting the next.
            arena.drop()
            self._arena_due = aid
        elif refill:
            try:
                self._arena_reply(aid)
            except ShmBrokerError:
                if self._sock is None and err is None:
                    raise
        if err is not None:
            if err.code == "ESTALE" and not nowait:
                return None
            raise err
        return at + hsize, chunk_id

    def _exchange_line_reply(self, want):
        """The reply (ok or not) of the request of id want, already sent."""
        if self._arena_due is not None and self._arena_due != want:
            self._take_due_arena()  # its reply comes first
        line = self._read_line()
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            reply = None
        if not isinstance(reply, dict) or reply.get("id") != want:
            raise self._out_of_step(json.dumps(want), "none" if not isinstance(reply, dict)
                                    else json.dumps(reply.get("id")), line)
        if "lost" in reply:
            self._note_lost(reply.pop("lost"))
        self._unconfirmed[0] = 0
        self._replies += 1
        return reply

    def _put_copy(self, key, part, total, readers, write=None, before_commit=None):
        """A put by alloc, copy, commit: (payload offset, None)."""
        write = write or _write
        a = self.alloc(key, total, readers=readers)
        try:
            write(a.view, part)
            if before_commit is not None:
                before_commit(a.offset, None)
        except BaseException:
            try:
                a.abort()
            except ShmBrokerError:
                pass
            raise
        a.commit()
        return a.offset, None


def _json_key(key):
    """A checked key as a JSON string, UTF-8 encoded."""
    # Printable ASCII without a quote or a backslash is its own JSON text
    # (the usual key: one a put's commit line carries, built per put).
    if key.isascii() and key.isprintable() and '"' not in key and "\\" not in key:
        return b'"%s"' % key.encode("ascii")
    return json.dumps(key, ensure_ascii=False).encode("utf-8")


def _prepare(data):
    """What put() writes for data, and its size: one flat byte view, or a
    list of them for a list or tuple of buffers (frames)."""
    if isinstance(data, (list, tuple)):
        bufs = [_frames.as_bytes(d) for d in data]
        return bufs, _frames.layout([b.nbytes for b in bufs])[2]
    src = _frames.as_bytes(data)
    return src, src.nbytes


def _write(view, part):
    """Write what _prepare gave into view, an allocation's bytes."""
    if isinstance(part, list):
        _frames.write(view, part)
    else:
        view[:] = part
