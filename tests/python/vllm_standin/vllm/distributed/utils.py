# SPDX-License-Identifier: Apache-2.0
"""Stand-in for vllm.distributed.utils: StatelessProcessGroup, the metadata
group of vLLM that is not torch.distributed, with the members the queue's
create_from_process_group uses (rank, world_size, broadcast_obj,
all_gather_obj) and barrier(). vLLM's keeps its objects in a torch TCPStore;
this one in a small key-value server, run by rank 0 at (host, port), that
every member reaches over TCP (standard library only, so that the tests run
without torch).
"""

import dataclasses
import pickle
import socket
import struct
import threading
import time

_LEN = struct.Struct("!I")


def _send(sock, obj):
    data = pickle.dumps(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


def _recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the store's connection closed")
        buf += chunk
    return buf


def _recv(sock):
    (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
    return pickle.loads(_recv_exact(sock, n))


class _StoreServer:
    """Keys set once; a get waits until its key is set."""

    def __init__(self, host, port):
        self.values = {}
        self.conns = 0
        self.cond = threading.Condition()
        self.listener = socket.create_server((host, port), reuse_port=False)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            conn, _ = self.listener.accept()
            with self.cond:
                self.conns += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            while True:
                op, key, value = _recv(conn)
                if op == "set":
                    with self.cond:
                        self.values[key] = value
                        self.cond.notify_all()
                    _send(conn, None)
                else:
                    with self.cond:
                        self.cond.wait_for(lambda: key in self.values)
                        got = self.values[key]
                    _send(conn, got)
        except (ConnectionError, OSError):
            conn.close()
            with self.cond:
                self.conns -= 1
                self.cond.notify_all()

    def wait_alone(self, timeout):
        """Until only the server's own member is connected: the process
        that serves the store must outlive the others' last requests."""
        with self.cond:
            return self.cond.wait_for(lambda: self.conns <= 1, timeout)


class _StoreClient:
    def __init__(self, host, port, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.create_connection((host, port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.lock = threading.Lock()

    def set(self, key, value):
        with self.lock:
            _send(self.sock, ("set", key, value))
            _recv(self.sock)

    def get(self, key):
        with self.lock:
            _send(self.sock, ("get", key, None))
            return _recv(self.sock)

    def close(self):
        self.sock.close()


@dataclasses.dataclass
class StatelessProcessGroup:
    """rank and world_size as vLLM's; store: where the objects go."""

    rank: int
    world_size: int
    store: object
    broadcast_send_counter: int = 0
    broadcast_recv_src_counter: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        assert 0 <= self.rank < self.world_size
        self.broadcast_recv_src_counter = {i: 0 for i in range(self.world_size)}

    def broadcast_obj(self, obj, src):
        """obj from member src to every member; each returns it."""
        if self.rank == src:
            self.store.set("broadcast_from/%d/%d" % (src, self.broadcast_send_counter), obj)
            self.broadcast_send_counter += 1
            return obj
        n = self.broadcast_recv_src_counter[src]
        self.broadcast_recv_src_counter[src] = n + 1
        return self.store.get("broadcast_from/%d/%d" % (src, n))

    def all_gather_obj(self, obj):
        """Every member's obj, in rank order."""
        return [self.broadcast_obj(obj if i == self.rank else None, i)
                for i in range(self.world_size)]

    def barrier(self):
        self.all_gather_obj(None)

    def close(self, timeout=60):
        """Not vLLM's: leave the store; rank 0, which serves it, first waits
        until every other member has left."""
        server = getattr(self.store, "server", None)
        if server is not None:
            server.wait_alone(timeout)
        self.store.close()

    @staticmethod
    def create(host, port, rank, world_size, data_expiration_seconds=3600, store_timeout=300):
        """A member of the group whose rank 0 serves the store at (host, port)."""
        if rank == 0:
            server = _StoreServer(host, port)
        store = _StoreClient(host, port, store_timeout)
        if rank == 0:
            store.server = server  # kept alive with the group
        return StatelessProcessGroup(rank=rank, world_size=world_size, store=store)
