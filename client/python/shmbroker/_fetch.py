# SPDX-License-Identifier: Apache-2.0
"""Client.fetch: an object from another host, through the local
shmbroker-relay. The relay's socket is the daemon's path with ".relay"
appended; one JSON line goes each way, as client/fetch.c does in C."""

import json
import re
import socket

from .errors import ConnectionLost, InvalidRequest, ProtocolError, error_for

RELAY_SOCKET_SUFFIX = ".relay"
_REPLY_MAX = 64 * 1024  # a relay's answer is a line of JSON; longer is a bug
_PEER_NAME = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")


def relay_socket_path(daemon_socket_path):
    """Where the relay next to the daemon at daemon_socket_path listens."""
    return daemon_socket_path + RELAY_SOCKET_SUFFIX


def check_peer(peer):
    """Raise InvalidRequest unless peer is a peer's name as the relay takes it."""
    if not isinstance(peer, str) or not _PEER_NAME.match(peer):
        raise InvalidRequest(
            "EINVAL", "A peer is named by 1 to 64 of A-Z a-z 0-9 - _ . (as the relay's "
            "--peer NAME=ADDR:PORT), not %r." % (peer,))


def ask(path, request, timeout=None):
    """One request to the relay at path, its reply (a dict with "ok": true);
    raises what the relay answered otherwise. timeout: seconds, None waits
    for ever (a fetch's or a subscription's answer comes when the peer's
    relay answers, or when the relay's own bounds give up)."""
    line = json.dumps(request, ensure_ascii=False).encode("utf-8") + b"\n"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(path)
        except OSError as e:
            raise ConnectionLost(
                "ENOTCONN", "No relay answers at %s (%s): start shmbroker-relay next to "
                "the daemon to reach other hosts." % (path, e.strerror or e)) from None
        buf = b""
        try:
            sock.sendall(line)
            while b"\n" not in buf:
                if len(buf) > _REPLY_MAX:
                    raise ProtocolError("EBADMSG", "The relay at %s answered with more than "
                                        "%d bytes without an end of line." % (path, _REPLY_MAX))
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionLost(
                        "ECONNRESET", "The relay at %s closed the connection before it "
                        "answered; is it still running?" % path)
                buf += chunk
        except socket.timeout:
            raise ConnectionLost("ETIMEDOUT", "The relay at %s did not answer within %s s."
                                 % (path, timeout)) from None
        except OSError as e:
            raise ConnectionLost("ECONNRESET", "The relay at %s went away (%s)."
                                 % (path, e.strerror or e)) from None
    finally:
        sock.close()
    try:
        reply = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ProtocolError("EBADMSG", "The relay at %s answered with something that is "
                            "not a JSON object." % path)
    if reply.get("ok") is True:
        return reply
    raise error_for(reply.get("error", "EIO"),
                    reply.get("message", "The relay refused the request without saying why."))


def fetch(client, peer, key):
    """Ask the relay next to client's daemon to bring key from peer; returns
    the object's size once it is committed in the local pool. Raises what
    the relay answered (NotFound, KeyExists, ConnectionLost, ...)."""
    check_peer(peer)
    reply = ask(relay_socket_path(client.socket_path), {"op": "fetch", "peer": peer, "key": key})
    return reply.get("size")
