# SPDX-License-Identifier: Apache-2.0
"""MessageQueue readers on other hosts, through shmbroker-relay.

The writer's queue has a reader seat for every reader, local or remote
(n_reader of them): seats 0..n_local_reader-1 for this host's readers,
the others for remote ones. A reader on another host makes (or finds) a
queue of the same name in its own daemon, takes a seat there, and asks its
relay to subscribe: that relay asks the writer's relay, which takes one of
the remote seats of the writer's queue for it and forwards every message,
once per host, to be published into the local queue. The reader then reads
as any local reader does; when its relay or the writer's host is cut off,
the end of the local queue is reported as ConnectionLost, not as the end
of the writer's stream.
"""

import os

from . import _fetch
from .errors import ConnectionLost, EndOfQueue, InvalidRequest, ShmBrokerError, Unsupported

# Seconds a subscription waits for the writer's relay to answer: far above
# a round trip, a bound against a relay that never answers.
SUBSCRIBE_TIMEOUT = 60


def writer_seats(n_reader, n_local_reader, seats_max):
    """The seats of a writer's queue: one per reader when some are remote."""
    if n_reader <= n_local_reader:
        return n_local_reader
    if n_reader > seats_max:
        raise InvalidRequest("EINVAL", "A queue has at most %d readers, local and remote "
                             "together, not %d." % (seats_max, n_reader))
    return n_reader


def export(mq, connect_ip):
    """Record in mq's handle where remote readers subscribe: the writer's
    host (connect_ip, as vLLM's) and the name its relay gives itself."""
    name = None
    try:
        name = _fetch.ask(_fetch.relay_socket_path(mq.client.socket_path),
                          {"op": "status"}, timeout=10).get("name")
    except ShmBrokerError:
        pass  # no relay here yet: remote readers find the writer by connect_ip
    mq.handle.remote = (connect_ip, name)


def _find_peer(relay_path, connect_ip, name):
    """The local relay's name for the writer's relay: the peer of the name
    the writer's relay gives itself, else the one dialled at connect_ip.
    The name comes first: the writer's relay said it, while connect_ip
    (VLLM_HOST_IP) may be an environment copied from another node, whose
    relay this one may well know too."""
    status = _fetch.ask(relay_path, {"op": "status"}, timeout=10)
    peers = [p for p in status.get("peers", []) if isinstance(p, dict)]
    for p in peers:
        if name and p.get("name") == name:
            return name
    if connect_ip:
        for p in peers:
            host = str(p.get("address", "")).rsplit(":", 1)[0].strip("[]")
            if p.get("direction") == "out" and host == connect_ip:
                return p.get("name")
    raise ConnectionLost("ENOTCONN", "The relay at %s has no peer at %s%s: give it "
                         "--peer NAME=%s:PORT (the writer's relay) to read this queue here."
                         % (relay_path, connect_ip, " or named %s" % name if name else "",
                            connect_ip or "ADDR"))


def join(handle, rank, client=None, socket_path=None, pool=None):
    """A reader of handle's queue on this host, whose writer is on another:
    a MessageQueue (RemoteReader) reading the local copy of the queue."""
    from . import queue as _queue

    remote = getattr(handle, "remote", None)
    n_reader, max_chunk_bytes, max_chunks, name = handle.buffer_handle
    n_local = len(handle.local_reader_ranks)
    if rank in handle.local_reader_ranks:
        raise Unsupported("ENOSYS", "Rank %r does not reach the daemon of queue '%s' (%s), "
                          "where its seat is (its local readers are %r): give it that "
                          "daemon's socket (SHMBROKER_SOCKET), or make the queue with a "
                          "remote seat for it (n_reader > n_local_reader) and run "
                          "shmbroker-relay on both hosts." %
                          (rank, name, handle.socket_path, handle.local_reader_ranks))
    if remote is None or n_reader <= n_local:
        raise Unsupported("ENOSYS", "Rank %r is not among the local readers %r, and the "
                          "queue has no remote readers (n_reader %d): make the writer's "
                          "MessageQueue with n_reader > n_local_reader, and run "
                          "shmbroker-relay on both hosts." %
                          (rank, handle.local_reader_ranks, n_reader))
    connect_ip, relay_name = remote
    kind = _bind()
    self = kind.__new__(kind)
    self._init_common()
    self.n_reader = n_reader
    self.n_local_reader = n_local
    self.local_reader_ranks = list(handle.local_reader_ranks)
    self.max_chunk_bytes = max_chunk_bytes
    self.max_chunks = max_chunks
    self.name = name
    self.handle = handle
    self._is_writer = False
    self.missed = 0
    self._connect(client, socket_path or os.environ.get("SHMBROKER_SOCKET"), pool,
                  "mq %s remote reader %s" % (name, rank))
    made = False
    try:
        relay_path = _fetch.relay_socket_path(self.client.socket_path)
        self._peer = _find_peer(relay_path, connect_ip, relay_name)
        self._relay_path = relay_path
        remote_seats = n_reader - n_local
        made = self.client._call({"op": "queue_create", "name": name, "seats": remote_seats,
                                  "slots": max_chunks, "slot_size": max_chunk_bytes,
                                  "temporary": True}).get("created") is True
        self._open_any_seat(_queue, remote_seats)
        reply = _fetch.ask(relay_path, {
            "op": "queue_subscribe", "peer": self._peer, "queue": name,
            "seat_from": n_local, "seat_to": n_reader, "seats": remote_seats,
            "slots": max_chunks, "slot_size": max_chunk_bytes}, timeout=SUBSCRIBE_TIMEOUT)
        self.missed = reply.get("missed", 0)
    except BaseException:
        keep, own = (self.client if made else None), self._own_client
        if keep is not None:
            self._own_client = False  # kept open for the delete below
        self.close()
        if keep is not None:
            _drop_copy(keep, name, own)
        raise
    return self


def _drop_copy(client, name, own):
    """Delete this host's copy of queue name, made by a join that failed:
    "temporary" removes a queue only once a writer has come, and none came
    (the relay's subscription failed), so it would stay for ever. The
    daemon refuses (EBUSY) while a writer or a live reader holds it: then
    another member's join uses it, and it is left to that one."""
    try:
        client._call({"op": "queue_delete", "name": name})
    except ShmBrokerError:
        pass
    finally:
        if own:
            client.close()


class RemoteReader:
    """Mixed into MessageQueue below: what a remote reader does otherwise."""

    def _open_any_seat(self, _queue, seats):
        """This host's copy of the queue, at the first seat free."""
        last = None
        for seat in range(seats):
            try:
                self._open({"op": "queue_open", "name": self.name, "role": "reader",
                            "seat": seat}, seat)
                self.local_reader_rank = seat
                return
            except ShmBrokerError as e:
                if e.code != "EBUSY":
                    raise
                last = e
        raise last

    def _why_ended(self, e):
        """EndOfQueue of the local copy: the writer's end, or a cut."""
        try:
            state = _fetch.ask(self._relay_path, {"op": "queue_state", "peer": self._peer,
                                                  "queue": self.name}, timeout=10)
        except ShmBrokerError as why:
            return ConnectionLost("ECONNRESET", "Queue '%s' from %s: this host's relay went "
                                  "away (%s); messages published since were not received. "
                                  "Join the queue again." % (self.name, self._peer, why))
        if state.get("state") == "ended" and state.get("code") in (-32, 0):
            return e
        return ConnectionLost("ECONNRESET", "Queue '%s' from %s was cut: %s. Messages "
                              "published since were not received; join the queue again."
                              % (self.name, self._peer, state.get("message") or "no reason"))

    def dequeue(self, *args, **kwargs):
        try:
            return super().dequeue(*args, **kwargs)
        except EndOfQueue as e:
            raise self._why_ended(e) from None


def _bind():
    """RemoteReader as a MessageQueue: made once queue.py is loaded."""
    global RemoteReader
    from .queue import MessageQueue
    if not issubclass(RemoteReader, MessageQueue):
        RemoteReader = type("RemoteReader", (RemoteReader, MessageQueue),
                            {"__doc__": "A MessageQueue reader whose writer is on another "
                             "host (shmbroker-relay)."})
    return RemoteReader
