# SPDX-License-Identifier: Apache-2.0
"""The key check of every call that names a key: a key is 1 to 255 bytes of
UTF-8 without NUL, checked here as the daemon checks it so that a bad one is
refused before anything is sent, with the daemon's words.

client.py re-exports check_key (shmbroker.check_key, shmbroker.client.
check_key); this module knows nothing of the socket or the mapping.
"""

from . import _protocol as P
from .errors import InvalidRequest


def _key_error(message):
    return InvalidRequest("EINVAL", message)


def check_key(key):
    """Check a key as the daemon does and return it as a str.

    A key is 1 to 255 bytes of UTF-8 without NUL; str or bytes are accepted.
    Raises InvalidRequest with the daemon's words otherwise (TypeError for
    anything that is not str or bytes)."""
    if type(key) is str and key.isascii():
        if 0 < len(key) <= P.KEY_MAX and "\0" not in key:
            return key
        raw = key.encode("ascii")
    elif isinstance(key, str):
        try:
            raw = key.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = key.encode("utf-8", "surrogatepass")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        raw = bytes(key)
    else:
        raise TypeError("A key is a str (or UTF-8 bytes), not %s." % type(key).__name__)
    if len(raw) == 0 or len(raw) > P.KEY_MAX:
        raise _key_error("Key of %d bytes: keys are 1 to %d bytes long." % (len(raw), P.KEY_MAX))
    nul = raw.find(b"\0")
    if nul >= 0:
        raise _key_error("Key contains a NUL byte at offset %d; keys are UTF-8 text of 1 to "
                         "%d bytes without NUL." % (nul, P.KEY_MAX))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _key_error("Key is not valid UTF-8 (byte 0x%02x at offset %d); keys are UTF-8 "
                         "text of 1 to %d bytes." % (raw[e.start], e.start, P.KEY_MAX)) from None
    if isinstance(key, str) and text != key:
        # Lone surrogates that spell valid UTF-8 bytes: storing them as the
        # text they spell would store another key than the one given.
        raise _key_error("Key holds lone surrogates (\\u%04x...), not text; keys are UTF-8 "
                         "text of 1 to %d bytes." % (ord(next(c for c in key
                                                             if 0xD800 <= ord(c) < 0xE000)),
                                                      P.KEY_MAX))
    return text


def _key_list(keys):
    """keys as a list; a single str or bytes is a key, not keys."""
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise TypeError("Expected an iterable of keys, not one %s." % type(keys).__name__)
    return list(keys)


def _check_keys(keys):
    """Check every key of a _many call before anything is sent."""
    out = []
    for i, key in enumerate(keys):
        try:
            out.append(check_key(key))
        except InvalidRequest as e:
            raise _key_error("keys[%d] of %d: %s Nothing was sent." % (i, len(keys), e)) from None
    return out
