# SPDX-License-Identifier: Apache-2.0
"""shmbroker: a zero-copy client of shmbrokerd, the shared-memory object broker.

The daemon owns one shared-memory segment and hands out space in it; this
package talks to it over its Unix socket and maps the segment, so object
bytes are written and read in place, never sent through the socket. Standard
library only.

    import shmbroker

    with shmbroker.Client() as c:          # $SHMBROKER_SOCKET or the default
        c.put("greeting", b"hello")        # any buffer: bytes, numpy arrays...
        with c.get("greeting") as pin:     # pinned: a read-only view, no copy
            print(bytes(pin.view))
        c.put("parts", [b"head", b"body"]) # several buffers ("frames")
        print(c.read_frames("parts"))
        try:
            c.get("missing")
        except shmbroker.NotFound as e:    # also a LookupError
            print(e.code, e)

One Client per thread. See help(shmbroker.Client) and the errors module;
help(shmbroker.MessageQueue) for broadcast queues (vLLM's MessageQueue).
"""

from . import frames
from .client import Allocation, Client, ObjectList, Pin, check_key, default_socket_path
from .errors import (BufferTooSmall, Cancelled, ConnectionLost, EndOfQueue, InvalidRequest,
                     KeyExists, NoSpace, NotFound, ObjectTooLarge, PermissionDenied,
                     ProtocolError, QuotaExceeded, ShmBrokerError, Timeout, Unsupported,
                     error_for)

__version__ = "0.1.0"

__all__ = [
    "Client", "Allocation", "Pin", "ObjectList", "check_key", "default_socket_path",
    "frames", "error_for", "ShmBrokerError", "NoSpace", "ObjectTooLarge", "KeyExists",
    "InvalidRequest", "NotFound", "Timeout", "PermissionDenied", "QuotaExceeded",
    "Unsupported", "ProtocolError", "ConnectionLost", "Cancelled", "EndOfQueue",
    "BufferTooSmall",
]


def _optional(module, names):
    """Export names of a sibling module when it is present in this copy of
    the package (pickling and daemon helpers)."""
    import importlib

    try:
        mod = importlib.import_module("." + module, __name__)
    except ModuleNotFoundError as e:
        if e.name != __name__ + "." + module:
            raise
        return
    for name in names:
        globals()[name] = getattr(mod, name)
        __all__.append(name)


_optional("pickling", ("dumps_into", "loads_from"))
_optional("daemon", ("spawn_daemon", "Daemon"))
_optional("queue", ("MessageQueue", "Handle"))
del _optional
