# SPDX-License-Identifier: Apache-2.0
"""A vLLM general plugin that switches vLLM's shared-memory classes over to
shmbroker's, without patching vLLM.

The package declares the entry point ``shmbroker = shmbroker.vllm_plugin:
register`` in the group ``vllm.general_plugins``. vLLM calls register() in
every process it starts (the API server, the engine core, each worker),
before it builds its queues and caches. register() does nothing unless
$SHMBROKER_VLLM is set:

- ``SHMBROKER_VLLM=1`` (or true, yes, on): use the daemon at
  $SHMBROKER_SOCKET, else the default socket, when one answers; when none
  does, start a private shmbrokerd in this process (it stops when this
  process exits) and put its socket in $SHMBROKER_SOCKET, so that every
  process vLLM starts from here finds it.
- ``SHMBROKER_VLLM=/path/to/socket``: use the daemon at that socket (it is
  put in $SHMBROKER_SOCKET for the processes started from here).
- unset, empty, 0 (false, no, off): nothing is touched.

With $SHMBROKER_VLLM set, ``SHMBROKER_VLLM_SHARED_MM=1`` also lets several
API servers share one multimodal shm cache (vllm_shared.enable_shared_mm_cache:
vLLM otherwise uses a cache per API server when there are several).

Then it checks that vLLM's MessageQueue, SingleWriterShmRingBuffer and
SingleWriterShmObjectStorage have the interfaces recorded in
_vllm_interfaces, and raises RuntimeError naming every difference when one
does not (nothing is replaced then): a drop-in for other interfaces would
fail later, somewhere nobody would look for it. When they match, each class
is replaced by shmbroker's in its defining module and in every module
already imported that holds vLLM's class under some name (``from
...shm_broadcast import MessageQueue`` in parallel_state, the executors,
the multimodal cache); modules imported later take the replacement from the
defining module. One log line (logger "vllm.plugins.shmbroker", under
vLLM's own logger so that vLLM's handler prints it) says what was replaced
and which daemon serves it.

This module knows vLLM's module paths and the environment; the interfaces
are _vllm_interfaces', the classes queue's and vllm's.
"""

import importlib
import logging
import os
import sys
import types

from . import _vllm_interfaces
from .client import default_socket_path

ENV = "SHMBROKER_VLLM"
# The size of the private daemon's segment, when the plugin starts one: the
# multimodal store's objects share it (its data_buffer_size is not reserved
# on a shared daemon), so size it as vLLM's mm_processor_cache_gb.
SIZE_ENV = "SHMBROKER_VLLM_SIZE"
DEFAULT_SIZE = "1G"
# The private daemon's bound on its queues' bytes: vLLM makes one queue of
# 10 slots of 24 MiB for the workers and one per worker for the answers,
# more than the daemon's default (256M) for 2 workers or more. Only a
# bound: each queue's memory is checked and reserved when it is created.
QUEUE_BYTES = "16G"

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")

logger = logging.getLogger("vllm.plugins.shmbroker")

# Set once this process has replaced the classes: vLLM may call register()
# more than once in a process (each load of the plugin group).
_replaced = None
# The private daemon this process started (kept so that it lives as long
# as the process).
_daemon = None


def _setting():
    value = os.environ.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value.lower() in _ON:
        return True
    if "/" in value:
        return value
    raise ValueError("%s=%r: set it to 1 to use the daemon at $SHMBROKER_SOCKET (or the "
                     "default socket, or a private one started here), to a daemon's socket "
                     "path (e.g. /run/shmbroker/shmbroker.sock), or to 0 or nothing to leave "
                     "vLLM's own classes in place." % (ENV, value))


def _shared_mm():
    """Whether $SHMBROKER_VLLM_SHARED_MM asks for one multimodal store shared
    by every API server (vllm_shared.enable_shared_mm_cache)."""
    from .vllm_shared import SHARED_ENV

    value = os.environ.get(SHARED_ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise ValueError("%s=%r: set it to 1 to let several vLLM API servers share one multimodal "
                     "shm cache, or to 0 or nothing for vLLM's choice (a cache per API server "
                     "when there are several)." % (SHARED_ENV, value))


def _daemon_for(setting):
    """The socket path every vLLM process is to use, and how it was found."""
    global _daemon
    from .daemon import socket_answers

    if setting is not True:
        path = os.path.abspath(setting)
        if not socket_answers(path):
            raise RuntimeError("%s=%s, but no shmbrokerd answers there. Start it (shmbrokerd "
                               "--socket %s, or its systemd socket), or set %s=1 to use the "
                               "default socket or a private daemon." % (ENV, setting, path, ENV))
        os.environ["SHMBROKER_SOCKET"] = path
        return path, "named by %s" % ENV
    path = default_socket_path()
    if socket_answers(path):
        return path, "shared"
    if _daemon is None:
        from .daemon import spawn_daemon

        size = os.environ.get(SIZE_ENV, "").strip() or DEFAULT_SIZE
        try:
            _daemon = spawn_daemon(size, args=["--max-queue-bytes", QUEUE_BYTES])
        except (OSError, RuntimeError, ValueError) as e:
            raise RuntimeError("%s=1: no shmbrokerd answers on %s, and starting a private one "
                               "of %s (%s) failed: %s. Start the daemon (systemctl start "
                               "shmbrokerd.socket, or shmbrokerd --socket PATH with "
                               "SHMBROKER_SOCKET=PATH), or set %s to a size that fits /dev/shm."
                               % (ENV, path, size, SIZE_ENV, e, SIZE_ENV)) from e
    os.environ["SHMBROKER_SOCKET"] = _daemon.socket_path
    return _daemon.socket_path, "private, started by process %d, stops with it" % os.getpid()


def _targets():
    """[(vLLM module, name, vLLM's class, our class)] for every class the
    table names. vLLM's modules are imported here (vLLM would anyway)."""
    out = []
    for (module, name), entry in _vllm_interfaces.CLASSES.items():
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise RuntimeError("%s is set, but vLLM's module %s cannot be imported (%s): this "
                               "vLLM is not one whose interfaces shmbroker mirrors. Unset %s to "
                               "run vLLM's own classes." % (ENV, module, e, ENV)) from e
        theirs = getattr(mod, name, None)
        if theirs is None:
            raise RuntimeError("%s is set, but vLLM's module %s has no %s: this vLLM is not one "
                               "whose interfaces shmbroker mirrors. Unset %s to run vLLM's own "
                               "classes." % (ENV, module, name, ENV))
        ours = getattr(importlib.import_module(entry["dropin"][0]), entry["dropin"][1])
        out.append((mod, name, theirs, ours))
    return out


def _check(targets):
    problems = []
    for mod, name, theirs, ours in targets:
        if theirs is ours:
            continue
        problems += _vllm_interfaces.vllm_differences((mod.__name__, name), theirs)
    if problems:
        recorded = "; ".join("%s at vLLM commit %s" % (f, s["commit"][:12])
                             for f, s in _vllm_interfaces.SOURCES.items())
        raise RuntimeError(
            "%s is set, but this vLLM's interfaces differ from those shmbroker %s mirrors "
            "(%s), so nothing was replaced:\n  %s\nUse a shmbroker made for this vLLM, or "
            "unset %s to run vLLM's own classes."
            % (ENV, _version(), recorded, "\n  ".join(problems), ENV))


def _version():
    from . import __version__

    return __version__


def _replace(targets):
    """Put our classes in place of vLLM's: in the defining modules, and in
    every imported module that holds one of vLLM's classes. Returns the
    names of the importers changed."""
    swap = {id(theirs): ours for _, _, theirs, ours in targets if theirs is not ours}
    for mod, name, theirs, ours in targets:
        setattr(mod, name, ours)
    changed = []
    for modname, mod in list(sys.modules.items()):
        if not isinstance(mod, types.ModuleType) or modname.startswith("shmbroker"):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for attr, value in items:
            ours = swap.get(id(value)) if isinstance(value, type) else None
            if ours is not None:
                setattr(mod, attr, ours)
                changed.append("%s.%s" % (modname, attr))
    return changed


def register():
    """vLLM's general plugin: replace vLLM's shared-memory classes by
    shmbroker's when $SHMBROKER_VLLM asks for it (see the module's doc).
    Raises ValueError for a value it does not understand, RuntimeError when
    no daemon can be had or vLLM's interfaces differ from the recorded ones."""
    global _replaced
    setting = _setting()
    if setting is None or _replaced is not None:
        return
    shared_mm = _shared_mm()
    targets = _targets()
    _check(targets)
    path, how = _daemon_for(setting)
    changed = _replace(targets)
    _replaced = [t[1] for t in targets]
    logger.info("shmbroker %s replaces vLLM's %s in process %d (and %d importers: %s), with "
                "shmbrokerd at %s (%s).",
                _version(), ", ".join("%s.%s" % (m.__name__, n) for m, n, _, _ in targets),
                os.getpid(), len(changed), ", ".join(changed) or "none yet", path, how)
    if shared_mm:
        from . import vllm_shared

        shared = vllm_shared.enable_shared_mm_cache()
        logger.info("shmbroker: %s is set: vLLM's multimodal shm cache is one store shared "
                    "by every API server (%s).", vllm_shared.SHARED_ENV,
                    ", ".join(shared) or "already")
