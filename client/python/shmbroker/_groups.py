# SPDX-License-Identifier: Apache-2.0
"""The process groups vLLM makes its queues over, behind the few collectives
MessageQueue.create_from_process_group needs: a torch.distributed
ProcessGroup, or vLLM's StatelessProcessGroup (anything with its rank,
world_size, broadcast_obj and all_gather_obj).

torch is imported only when a torch group is given: the package stays
standard library only for everyone else. Nothing here knows about queues;
node_key says which host and which daemon socket a process would use.
"""

import os

from . import client as _client

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


class _Stateless:
    """vLLM's StatelessProcessGroup: group ranks are its ranks."""

    def __init__(self, pg):
        self.pg = pg
        self.rank = pg.rank
        self.world_size = pg.world_size
        self.global_ranks = list(range(pg.world_size))

    def broadcast(self, obj, src):
        return self.pg.broadcast_obj(obj if self.rank == src else None, src)

    def all_gather(self, obj):
        return list(self.pg.all_gather_obj(obj))


class _Torch:
    """A torch.distributed ProcessGroup: collectives name global ranks."""

    def __init__(self, pg):
        import torch.distributed as dist

        self.dist = dist
        self.pg = pg
        self.rank = dist.get_rank(pg)
        self.world_size = dist.get_world_size(pg)
        self.global_ranks = list(dist.get_process_group_ranks(pg))

    def broadcast(self, obj, src):
        box = [obj if self.rank == src else None]
        self.dist.broadcast_object_list(box, src=self.global_ranks[src], group=self.pg)
        return box[0]

    def all_gather(self, obj):
        out = [None] * self.world_size
        self.dist.all_gather_object(out, obj, group=self.pg)
        return out


def wrap(pg):
    """The group's collectives; TypeError for something that is neither."""
    if all(hasattr(pg, a) for a in ("rank", "world_size", "broadcast_obj", "all_gather_obj")):
        return _Stateless(pg)
    if callable(getattr(pg, "rank", None)) and callable(getattr(pg, "size", None)):
        return _Torch(pg)
    raise TypeError("pg must be a torch.distributed ProcessGroup or vLLM's "
                    "StatelessProcessGroup, not %r." % (type(pg).__name__,))


def node_key(socket_path=None):
    """What two processes must share to use one queue: the running kernel
    (its boot id) and the daemon's socket (the same file, seen from either
    process, as bind mounts keep it); the path itself when it does not
    exist yet."""
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = os.uname().nodename
    path = _client.default_socket_path(socket_path)
    try:
        st = os.stat(path)
        where = ("socket", st.st_dev, st.st_ino)
    except OSError:
        where = ("path", os.path.abspath(path))
    return boot, where
