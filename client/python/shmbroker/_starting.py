# SPDX-License-Identifier: Apache-2.0
"""The progress of a shmbrokerd that is starting, as proto/starting.h writes it.

While the daemon reserves its pools (seconds for gigabytes) its socket does
not listen yet, and a connect is refused; it writes "<pid>\\n<text>\\n" to
"<socket>.starting" meanwhile, holding an exclusive flock on it, which a
refused client reads to say that it is starting and how far, rather than
asking whether it runs.
"""

import errno
import fcntl
import os

SUFFIX = ".starting"
TEXT_MAX = 256


def _trusted(path, uid):
    """Whether uid, the owner of the progress file at path, may speak for
    the daemon: this user, root, or the owner of the file's directory (the
    run directory the daemon's user was given)."""
    if uid in (os.geteuid(), 0):
        return True
    try:
        return os.stat(os.path.dirname(path) or b".").st_uid == uid
    except OSError:
        return False


def progress(socket_path):
    """(pid, text) of a daemon starting at socket_path, or None when there is
    no such file, one nobody holds locked (its daemon was killed at it), one
    not in the format, or one anyone could have planted (writable by others,
    or owned by a user other than this one, root and its directory's
    owner). The text is the daemon's, with characters that
    are not printable shown as \\xNN."""
    path = os.fsencode(socket_path) + SUFFIX.encode()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        # One others may write, or of a user who is not this one, root or
        # the directory's owner, anyone could have planted (in /tmp).
        if (st.st_mode & 0o170000 != 0o100000 or st.st_mode & 0o022
                or not _trusted(path, st.st_uid)):
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it: no daemon is starting
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
        data = os.pread(fd, TEXT_MAX + 64, 0)
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
    text = "".join(c if c.isprintable() else "\\x%02x" % ord(c)
                   for c in lines[1].decode("utf-8", "backslashreplace"))
    return pid, text
