# SPDX-License-Identifier: Apache-2.0
"""The exceptions of the shmbroker client: one class per protocol error code.

Each class is also a subclass of the built-in exception that Python code
already catches for that kind of failure (NoSpace is a MemoryError, NotFound a
LookupError...), so code written against other stores keeps working. Branch on
the class or on ``.code``; show ``.message`` (also ``str(e)``) to people.
"""

__all__ = [
    "ShmBrokerError", "NoSpace", "ObjectTooLarge", "KeyExists", "InvalidRequest",
    "NotFound", "Timeout", "PermissionDenied", "QuotaExceeded", "Unsupported",
    "ProtocolError", "ConnectionLost", "Cancelled", "EndOfQueue", "BufferTooSmall",
    "error_for",
]


class ShmBrokerError(Exception):
    """A failure reported by shmbrokerd or by this client.

    Attributes:
        code: the protocol's error code, a string such as ``"ENOSPC"``.
        message: the daemon's sentence (or this client's), for people.
    ``str(e)`` is the message.
    """

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self):
        return self.message

    def __reduce__(self):
        # The same class back (a ConnectionLost of code ENOENT stays one).
        return (_rebuild, (type(self), self.code, self.message))


class NoSpace(ShmBrokerError, MemoryError):
    """ENOSPC: no room in the segment even after reclaiming what may go.

    The message names the oldest object that blocks reclaim."""


class ObjectTooLarge(ShmBrokerError, ValueError):
    """E2BIG: the object is larger than the daemon's max_object_size."""


class KeyExists(ShmBrokerError, ValueError):
    """EEXIST: the key is taken (committed or being written)."""


class InvalidRequest(ShmBrokerError, ValueError):
    """EINVAL: a malformed request, a value out of range or a bad key."""


class NotFound(ShmBrokerError, LookupError):
    """ENOENT: no such object (or pin, or pending allocation) in the state the
    call needs."""


class Timeout(ShmBrokerError, TimeoutError):
    """ETIMEDOUT: a wait for space ran out, or an allocation was dropped for
    not being committed within --alloc-timeout."""


class PermissionDenied(ShmBrokerError, PermissionError):
    """EPERM: a read-only client asked to write, or the daemon does not admit
    this user."""


class QuotaExceeded(ShmBrokerError):
    """EDQUOT: a per-connection or per-daemon cap (--max-pins, --max-pending,
    --max-clients...) was reached; the message names the flag."""


class Unsupported(ShmBrokerError, NotImplementedError):
    """ENOSYS: the daemon does not know the op."""


class ProtocolError(ShmBrokerError):
    """EPROTO or EMSGSIZE: a line the other side could not take, a reply this
    client cannot trust, or a payload that is not in the expected layout."""


class ConnectionLost(ShmBrokerError, ConnectionError):
    """The connection was refused or lost (no daemon at the path, the daemon
    stopped or died, or a reply came out of step with its request).

    Every pin and pending allocation of the connection is gone; call
    ``Client.reconnect()`` to go on."""


class Cancelled(ShmBrokerError, RuntimeError):
    """ECANCELED: the queue was shut down (queue_shutdown, or the daemon
    stopping); every wait of its members ends with it. A RuntimeError whose
    message says "cancelled", as vLLM's MessageQueue raises."""


class EndOfQueue(ShmBrokerError, EOFError):
    """EPIPE from a queue reader: the queue's writer is gone (closed, exited
    or killed) and every message it published has been read."""


class BufferTooSmall(ShmBrokerError, ValueError):
    """ENOBUFS from Client.read_into(): the buffer is smaller than the
    object; ``.size`` is the object's size (nothing was copied)."""

    def __init__(self, code, message, size=None):
        super().__init__(code, message)
        self.size = size


_CLASSES = {
    "ENOSPC": NoSpace,
    "E2BIG": ObjectTooLarge,
    "EEXIST": KeyExists,
    "EINVAL": InvalidRequest,
    "ENOENT": NotFound,
    "ETIMEDOUT": Timeout,
    "EPERM": PermissionDenied,
    "EDQUOT": QuotaExceeded,
    "ENOSYS": Unsupported,
    "EPROTO": ProtocolError,
    "EMSGSIZE": ProtocolError,
    "ECONNREFUSED": ConnectionLost,
    "ECONNRESET": ConnectionLost,
    "ENOTCONN": ConnectionLost,
    "EPIPE": ConnectionLost,
    "ECANCELED": Cancelled,
    "ENOBUFS": BufferTooSmall,
}


def error_for(code, message):
    """The exception for a protocol error code and its message.

    Codes without a class of their own (EIO, ENOMEM, EMFILE, one added to the
    protocol later) give a plain ShmBrokerError."""
    return _CLASSES.get(code, ShmBrokerError)(code, message)


def _rebuild(cls, code, message):
    """An unpickled error: the class it was, with its code and message."""
    return cls(code, message)
