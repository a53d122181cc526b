# SPDX-License-Identifier: Apache-2.0
"""The wire of a Client: where its socket is, connecting and hello, the line
exchange with its ids, replies and errors, noreply lines and batch lines.

Client inherits Wire; these methods keep the connection's state on the
Client (its socket, read buffer, ids, lock). This module knows the protocol
(proto/PROTOCOL.md) through _protocol's tables and never touches object
bytes: mapping the segment hello passes is _mapping's, the public calls are
client's.
"""

import errno as _errno
import grp
import json
import os
import pwd
import select
import socket
import stat
import weakref

from . import _starting
from . import _protocol as P
from ._mapping import _release_view
from .errors import ConnectionLost, InvalidRequest, PermissionDenied, ProtocolError
from .errors import ShmBrokerError, error_for

_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)
# Refusals of this client before anything is sent: the call may be made again.
_NOT_SENT = ("EBUSY", "ECHILD")
# A reply without an id; also "no id given" where None is an id a caller gave.
_NO_ID = object()
_INT64 = (-(1 << 63), (1 << 63) - 1)
# One encoder for every request (json.dumps with arguments builds a new one
# per call); NaN and infinities are refused, the daemon's JSON has none.
_encode_json = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                allow_nan=False).encode
# Descriptors received close on exec, so a child spawned meanwhile gets none.
_RECV_FLAGS = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
# Room for more than one descriptor, so that extra ones are received (and
# closed) rather than leaked by a truncated control message.
_MAX_FDS = 8
# What poll() reports of a connection whose daemon's end is closed.
_HANGUP = (getattr(select, "POLLRDHUP", 0x2000) | select.POLLHUP | select.POLLERR
           | select.POLLNVAL)
_RECV_SIZE = 256 * 1024

# fork() makes children share the parent's socket; a client connected before
# the fork refuses calls in the child (its replies would mix with the
# parent's). A counter bumped in the child, read at every call.
_forks = [0]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


def user_socket_path():
    """The socket of a daemon run by a user without root (one that cannot
    write /run/shmbroker): $XDG_RUNTIME_DIR/shmbroker/shmbroker.sock when
    XDG_RUNTIME_DIR is an absolute path, else /tmp/shmbroker-EUID/shmbroker.sock
    (as the daemon and the C library)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, P.USER_SOCKET_DIR, P.USER_SOCKET_NAME)
    return "%s%d/%s" % (P.USER_SOCKET_TMP, os.geteuid(), P.USER_SOCKET_NAME)


def _private_dir(path):
    """True when path is a directory (not a link) of this user's that no one
    else may write: anyone could have made one in /tmp first."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and st.st_mode & 0o022 == 0)


def default_socket_path(socket_path=None):
    """The socket path a client uses: socket_path when given, else
    $SHMBROKER_SOCKET when set and not empty, else (not root) this user's own
    daemon's socket when one is there (user_socket_path()), else
    /run/shmbroker/shmbroker.sock (as the C library and the daemon)."""
    if socket_path:
        return os.fspath(socket_path)
    env = os.environ.get(P.SOCKET_ENV)
    if env:
        return env
    if os.geteuid() != 0:
        user = user_socket_path()
        try:
            is_socket = stat.S_ISSOCK(os.stat(user).st_mode)
        except OSError:
            is_socket = False
        if (is_socket and len(os.fsencode(user)) < 108
                and _private_dir(os.path.dirname(user))):
            return user
    return P.DEFAULT_SOCKET


def _id_name(ident, group):
    try:
        return grp.getgrgid(ident).gr_name if group else pwd.getpwuid(ident).pw_name
    except KeyError:
        return "?"


def _access_message(path):
    """Why connect() to path met EACCES: whose the socket is and what lets
    this process in (its daemon runs: the socket is there)."""
    what, shown = path, "the socket"
    try:
        st = os.stat(path)
    except OSError:
        what = os.path.dirname(path) or "/"
        shown = "its directory " + what
        try:
            st = os.stat(what)
        except OSError:
            return ("Permission denied connecting to shmbrokerd at %s: this process (uid "
                    "%d, gid %d) may not reach the socket's directory. Run as a user who "
                    "may, or choose another socket (--socket of shmbrokerd and of this "
                    "client)." % (path, os.geteuid(), os.getegid()))
    group = _id_name(st.st_gid, True)
    # usermod takes a gid too: a group without a name here is joined by it.
    join = str(st.st_gid) if group == "?" else group
    return ("Permission denied connecting to shmbrokerd at %s: %s belongs to user %s (uid "
            "%d) and group %s (gid %d) with mode %04o, and this process runs as uid %d, gid "
            "%d, whom that mode does not let in. Join the group (usermod -aG %s USER, then "
            "log in again; in a container, add gid %d to the worker's groups), or start "
            "shmbrokerd with "
            "--socket-mode 0666 (with --allow-gid GROUP or --allow-uid USER to keep others "
            "out)." % (path, shown, _id_name(st.st_uid, False), st.st_uid, group, st.st_gid,
                       st.st_mode & 0o7777, os.geteuid(), os.getegid(), join, st.st_gid))


def _check_values(obj):
    """Refuse, before sending, what the daemon cannot parse and would answer
    without an id (a reply out of step, which resets the connection):
    integers beyond 64 bits and strings holding NUL."""
    for v in obj.values() if isinstance(obj, dict) else obj:
        t = type(v)
        if t is int:
            if not _INT64[0] <= v <= _INT64[1]:
                raise InvalidRequest("EINVAL", "The integer %d is beyond the protocol's 64 bits; "
                                     "nothing was sent." % v)
        elif t is str:
            if "\0" in v:
                raise InvalidRequest("EINVAL", "A text holds a NUL character, which the "
                                     "protocol does not carry; nothing was sent.")
        elif isinstance(v, (dict, list, tuple)):
            _check_values(v)
        elif isinstance(v, int) and not isinstance(v, bool):
            _check_values([int(v)])
    if isinstance(obj, dict):
        for k in obj:
            if type(k) is str and "\0" in k:
                raise InvalidRequest("EINVAL", "A field name holds a NUL character; nothing "
                                     "was sent.")


class Wire:
    """The connection half of Client: dial, hello, send, receive, match a
    reply to its request by id, and close."""

    def _disconnect(self, keep_map):
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._poller = None
        self._rbuf = bytearray()
        self._later.clear()
        self._arena.drop()
        self._arena_due = None
        self._unconfirmed_lost()
        self._gen += 1
        extents, self._extents = self._extents, weakref.WeakSet()
        for extent in list(extents):
            extent._connection_lost()
        if keep_map or self._mmap is None:
            return
        self._drop_catalog()
        _release_view(self._mv)
        try:
            self._mmap.close()
        except BufferError:
            pass  # views still exported: the mapping goes with the last of them
        self._mmap = None
        self._mv = None
        self._map_file = None

    def reconnect(self):
        """Connect again after a lost connection (or at any time), as
        shmb_reconnect: say hello again and keep the mapping when the new
        descriptor is of the same file (st_dev, st_ino) with the same size, so
        that views of objects committed before a daemon restart stay valid
        (get them again to pin them). Pins and allocations of the old
        connection are gone."""
        if self.closed:
            raise ConnectionLost("ENOTCONN", "This client is closed; make a new Client.")
        # As any call: a read in another thread would otherwise answer from
        # the old mapping while this one's new connection is being made.
        if not self._busy.acquire(False):
            raise _busy_error()
        try:
            self._dial(keep_map=True)
        finally:
            self._busy.release()

    def _dial(self, keep_map):
        self._disconnect(keep_map)
        path = self.socket_path
        if len(os.fsencode(path)) >= 108:
            raise InvalidRequest("ENAMETOOLONG", "Socket path %s is too long." % path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError as e:
            sock.close()
            code = _errno.errorcode.get(e.errno, "ECONNREFUSED")
            where = path
            if path == P.DEFAULT_SOCKET and os.geteuid() != 0:
                # The system's socket was tried because this user has none
                # of its own: say where a daemon of its own would be.
                where = "%s: %s, nor at this user's %s" % (path, e.strerror or e,
                                                            user_socket_path())
            else:
                where = "%s: %s" % (path, e.strerror or e)
            message = ("Cannot connect to shmbrokerd at %s. Is shmbrokerd running? Start "
                       "it (`make run` in its source tree, `systemctl start shmbrokerd`, or "
                       "`shmbrokerd --socket %s`), or set %s or pass the socket path."
                       % (where, path, P.SOCKET_ENV))
            if e.errno == _errno.EACCES:
                raise PermissionDenied(code, _access_message(path)) from None
            if e.errno == _errno.EPERM:
                raise PermissionDenied(code, message) from None
            starting = (_starting.progress(path)
                        if e.errno in (_errno.ECONNREFUSED, _errno.ENOENT) else None)
            if starting is not None:
                raise ConnectionLost(
                    "EAGAIN", "shmbrokerd at %s is starting (pid %d): %s. It answers once "
                    "its pools are reserved; retry then." % ((path,) + starting)) from None
            raise ConnectionLost(code, message) from None
        self._sock = sock
        self._poller = select.poll()
        self._poller.register(sock, _HANGUP)
        self._forks = _forks[0]
        fds = []
        try:
            # Our pid: a daemon in another pid namespace sees 0 for it.
            hello = {"op": "hello", "version": P.PROTOCOL_VERSION,
                     "mode": "ro" if self.read_only else "rw",
                     "pid": os.getpid()}
            if self.name is not None:
                hello["name"] = self.name
            if self.pool is not None:
                hello["pool"] = self.pool
            reply = self._exchange(hello, fds=fds, first=True)
            if reply.get("ok") is not True:
                raise _reply_error(reply)
            self._map(reply, fds)
        except BaseException:
            self._disconnect(keep_map)
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def _enter(self):
        if self._sock is None:
            if self.closed:
                raise ConnectionLost("ENOTCONN", "This client is closed; make a new Client.")
            raise ConnectionLost("ENOTCONN", "Not connected to shmbrokerd; call reconnect() "
                                 "after a lost connection.")
        if self._forks != _forks[0]:
            raise ShmBrokerError("ECHILD", "This client was connected by another process and "
                                 "is used in a child made by fork() since: the connection "
                                 "belongs to the parent. Nothing was sent; make a new Client "
                                 "in the child.")
        if not self._busy.acquire(False):
            raise _busy_error()

    def _lost(self, what, err=None):
        self._disconnect(keep_map=True)
        return ConnectionLost("ECONNRESET", "Connection to shmbrokerd lost (%s: %s); every pin "
                              "and pending allocation of this client was released. Call "
                              "reconnect() to go on: committed objects and the mapping stay."
                              % (what, err.strerror if err else "closed by the daemon"))

    def _next_id(self):
        self._last_id += 1
        return self._last_id

    def _encode(self, obj):
        _check_values(obj)
        try:
            line = _encode_json(obj).encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidRequest("EINVAL", "A request's text is not valid UTF-8 (%s); the "
                                 "protocol carries UTF-8 only. Nothing was sent." % e) from None
        except ValueError as e:
            raise InvalidRequest("EINVAL", "A request cannot be sent as JSON (%s). Nothing "
                                 "was sent." % e) from None
        if len(line) > P.MAX_LINE:
            raise ProtocolError("EMSGSIZE", "A request of %d bytes is longer than the %d a line "
                                "may hold. Nothing was sent." % (len(line), P.MAX_LINE))
        return line + b"\n"

    def _pending_lines(self):
        """The noreply releases queued by release_later(), as lines."""
        out = []
        later = self._later
        gen = self._gen
        while later:
            g, key = later.popleft()
            if g == gen:
                out.append(b'{"op":"release","key":%s,"noreply":true,"id":%d}\n'
                           % (json.dumps(key, ensure_ascii=False).encode(), self._next_id()))
        return out

    def _send(self, data):
        try:
            self._sock.sendall(data, _SEND_FLAGS)
        except OSError as e:
            raise self._lost("send", e) from None
        except BaseException:
            # Interrupted (KeyboardInterrupt, say) part way: half a line may
            # be out, and the next request would be glued to it.
            self._disconnect(keep_map=True)
            raise

    def _read_line(self, fds=None):
        buf = self._rbuf
        scan = 0
        while True:
            i = buf.find(b"\n", scan)
            if i >= 0:
                line = bytes(buf[:i])
                del buf[:i + 1]
                return line
            scan = len(buf)
            if scan > P.MAX_REPLY:
                self._disconnect(keep_map=True)
                raise ProtocolError("EMSGSIZE", "Reply from shmbrokerd longer than %d bytes; "
                                    "the connection was closed." % P.MAX_REPLY)
            try:
                if fds is not None:
                    data, got, _flags, _addr = socket.recv_fds(self._sock, _RECV_SIZE, _MAX_FDS,
                                                               _RECV_FLAGS)
                    fds.extend(got)
                else:
                    data = self._sock.recv(_RECV_SIZE)
            except InterruptedError:
                continue
            except OSError as e:
                raise self._lost("receive", e) from None
            if not data:
                raise self._lost("receive")
            buf += data

    def _out_of_step(self, want, got, line):
        seen = line[:160].decode("utf-8", "backslashreplace")
        self._disconnect(keep_map=True)
        return ConnectionLost("ECONNRESET", "Reply out of step with its request: expected id %s, "
                              "got id %s (%s%s). The connection was reset so that no call "
                              "takes another's reply: every pin and pending allocation of "
                              "this client was released. Call reconnect() to go on."
                              % (want, got, seen, "..." if len(line) > 160 else ""))

    def _hello_line(self, data, fds):
        """Send hello and read the line that answers it. A daemon that refuses
        the connection (section 1: --max-clients, --allow-uid...) writes its
        line and closes, often before hello arrives, so that sending fails:
        the refusal is read all the same and answers the hello."""
        try:
            self._sock.sendall(data, _SEND_FLAGS)
        except OSError as e:
            try:
                line = self._read_line(fds)
            except ShmBrokerError:
                line = b""
            if line:
                return line
            raise self._lost("send", e) from None
        return self._read_line(fds)

    def _exchange(self, req, fds=None, first=False, want=_NO_ID):
        """Send req (a dict; an id is added unless want is given) after any
        queued releases, and return its reply dict, ok or not. The reply
        must carry the request's id."""
        if want is _NO_ID:
            want = req["id"] = self._next_id()
        return self._exchange_line(self._encode(req), want, fds, first)

    def _exchange_line(self, line, want, fds=None, first=False):
        """Send line (encoded, newline included) after any queued releases
        and return its reply dict, which must carry the id want."""
        if self._arena_due is not None and not first:
            self._take_due_arena()  # its reply comes first
        out = self._pending_lines() if self._later else []
        out.append(line)
        try:
            if first:
                line = self._hello_line(out[0], fds)
            else:
                self._send(b"".join(out) if len(out) > 1 else out[0])
                line = self._read_line(fds)
        except ShmBrokerError:
            raise
        except BaseException:
            # Interrupted (KeyboardInterrupt, say) between a request and its
            # reply: the reply would meet the next call, so the connection
            # goes now (reconnect() to go on).
            self._disconnect(keep_map=True)
            raise
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            # RecursionError: nested deeper than json decodes; a reply that
            # cannot be read either way.
            reply = None
        if not isinstance(reply, dict):
            raise self._out_of_step(json.dumps(want), "none", line)
        got = reply.get("id", _NO_ID)
        if got is _NO_ID:
            if first and reply.get("ok") is False and isinstance(reply.get("error"), str):
                self._disconnect(keep_map=True)  # a refusal at connect time: EOF follows
                return reply
            raise self._out_of_step(json.dumps(want), "none", line)
        if got != want or type(got) is not type(want):
            raise self._out_of_step(json.dumps(want), json.dumps(got), line)
        # A reply proves every request sent before it handled; it tells of
        # those sent without waiting that were refused.
        if "lost" in reply:
            self._note_lost(reply.pop("lost"))
        self._unconfirmed[0] = 0
        self._deleting = ()
        self._replies += 1
        return reply

    def _note_lost(self, lost):
        """Record a reply's "lost" (noreply requests the daemon refused since
        its last reply), for the next put or sync() to report."""
        if not isinstance(lost, dict):
            return
        count, key, code, message = (lost.get(k) for k in ("count", "key", "error", "message"))
        if type(count) is not int or count <= 0:
            return
        if self._lost_puts[0] == 0:
            self._lost_puts[1:] = [key if isinstance(key, str) else "?",
                              code if isinstance(code, str) else "EIO",
                              message if isinstance(message, str) else ""]
        self._lost_puts[0] += count

    def _unconfirmed_lost(self):
        """The connection went before a reply confirmed the puts sent
        without waiting: they may be lost."""
        n = self._unconfirmed[0]
        if n == 0:
            return
        self._unconfirmed[0] = 0
        if self._lost_puts[0] == 0:
            self._lost_puts[1:] = [self._unconfirmed[1], "ECONNRESET",
                              "the connection ended before shmbrokerd answered a later request"]
        self._lost_puts[0] += n

    def _call(self, req):
        """One request whose failure raises; the reply dict on success."""
        self._enter()
        try:
            reply = self._exchange(req)
        finally:
            self._busy.release()
        if reply.get("ok") is not True:
            raise _reply_error(reply)
        return reply

    def _call_fds(self, req):
        """_call() for a reply that passes descriptors (SCM_RIGHTS, as
        queue_open's): (reply, fds). The caller owns the descriptors; on an
        error they are closed here."""
        fds = []
        self._enter()
        try:
            reply = self._exchange(req, fds=fds)
        except BaseException:
            _close_fds(fds)
            raise
        finally:
            self._busy.release()
        if reply.get("ok") is not True:
            _close_fds(fds)
            raise _reply_error(reply)
        return reply, fds

    def _send_noreply(self, req):
        self._enter()
        try:
            self._send_noreply_held(req)
        finally:
            self._busy.release()

    def _send_noreply_held(self, req):
        """_send_noreply() by a call that holds this client's lock."""
        req["noreply"] = True
        req["id"] = self._next_id()
        out = self._pending_lines() if self._later else []
        out.append(self._encode(req))
        self._send(b"".join(out))

    def _batch(self, elems):
        """One batch line of the encoded elements; their replies, in order."""
        self._enter()
        try:
            want = self._next_id()
            line = b'{"op":"batch","id":%d,"ops":[%s]}' % (want, b",".join(elems))
            reply = self._exchange_line(line + b"\n", want)
        finally:
            self._busy.release()
        if reply.get("ok") is not True:
            raise _reply_error(reply)
        replies = reply.get("replies")
        if not isinstance(replies, list) or len(replies) != len(elems):
            raise ProtocolError("EPROTO", "shmbrokerd's batch reply does not have %d replies."
                                % len(elems))
        return replies

    @staticmethod
    def _fill(elems, start, limit):
        """How many elements from start fit one batch line (at least one)."""
        room = P.MAX_LINE - len(b'{"op":"batch","id":18446744073709551615,"ops":[]}')
        n = 0
        used = 0
        while start + n < len(elems) and n < limit:
            cost = len(elems[start + n]) + (1 if n else 0)
            if n and used + cost > room:
                break
            used += cost
            n += 1
        return n


def _busy_error():
    """What a call made while another thread's runs on the same client
    raises (nothing was sent)."""
    return ShmBrokerError("EBUSY", "Another call is running on this client (in another "
                          "thread); nothing was sent. Use one Client per thread.")


def _close_fds(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _reply_list(reply, field, missing=None):
    """The list field of a success reply (missing when absent, if given):
    ProtocolError when the daemon sent none, or something else, rather than
    a KeyError or a TypeError from the caller's loop."""
    value = reply.get(field, missing)
    if not isinstance(value, list):
        raise ProtocolError("EPROTO", "shmbrokerd's reply lacks a list \"%s\": %.160r."
                            % (field, reply))
    return value


def _reply_error(reply):
    """The exception for an error reply (or for a malformed one)."""
    if isinstance(reply, dict):
        code, message = reply.get("error"), reply.get("message")
        if isinstance(code, str) and isinstance(message, str):
            return error_for(code, message)
    return ProtocolError("EPROTO", "Malformed reply from shmbrokerd: %.160r." % (reply,))
