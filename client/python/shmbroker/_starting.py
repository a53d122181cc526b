# SPDX-License-Identifier: Apache-2.0
"""The progress of a shmbrokerd that is starting, as proto/starting.h writes it.

While the daemon reserves its pools (seconds for gigabytes) its socket does
not listen yet, and a connect is refused; it writes "<pid>\\n<text>\\n" to
"<socket>.starting" meanwhile, which a refused client reads to say that it
is starting and how far, rather than asking whether it runs.
"""

import errno
import os
import time

SUFFIX = ".starting"
# A file whose daemon this process cannot see (another pid namespace) counts
# while it was written this recently (the daemon writes it at every 256 MiB).
FRESH_S = 60
TEXT_MAX = 256


def progress(socket_path):
    """(pid, text) of a daemon starting at socket_path, or None when there is
    no such file, a stale one (its daemon gone) or one not in the format.
    The text is the daemon's, with control characters shown as \\xNN."""
    path = os.fsencode(socket_path) + SUFFIX.encode()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000):
            return None
        data = os.read(fd, TEXT_MAX + 64)
    except OSError:
        return None
    finally:
        os.close(fd)
    lines = data.split(b"\n")
    if len(lines) < 3 or not lines[0].isdigit():
        return None
    pid = int(lines[0])
    if not 0 < pid <= 4194304:
        return None
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass
    except OSError as e:
        if e.errno != errno.ESRCH or time.time() - st.st_mtime > FRESH_S:
            return None
    text = "".join(c if c.isprintable() else "\\x%02x" % ord(c)
                   for c in lines[1].decode("utf-8", "backslashreplace"))
    return pid, text
