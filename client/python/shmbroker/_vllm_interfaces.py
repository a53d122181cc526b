# SPDX-License-Identifier: Apache-2.0
"""The vLLM interfaces the drop-ins mirror, as recorded from vLLM's sources.

For each vLLM class that shmbroker replaces: every public method of the
class at the recorded vLLM commit, with its parameters (annotations left
out; a default is written as its value when it is a plain constant, as
"..." when it is anything else). Two checks read the table:

- vllm_differences(): vLLM's class as found installed against the table,
  exactly (the same public methods, the same parameters and defaults, the
  same static methods). The vLLM plugin refuses to replace anything when a
  class differs: a drop-in made for other interfaces would break vLLM in
  ways nobody would trace back to it.
- dropin_differences(): our drop-in against the table, as a caller of
  vLLM's class sees it: every method of "methods" is there, static where
  vLLM's is, and takes every call vLLM's takes (the same parameter names in
  the same order and kinds, the same constant defaults; a parameter vLLM
  requires may have a default here, and more parameters may follow when
  they have defaults or are keyword-only). The "internal" methods are
  public in vLLM but called only from inside its own class; they are
  recorded for the first check and not asked of the drop-in.

This module knows signatures, not what the classes do.
"""

import importlib
import inspect

# The vLLM files the table was read from. "commit" is the vLLM commit whose
# text was read; "release" the vLLM release line it belongs to, where known.
SOURCES = {
    "vllm/distributed/device_communicators/shm_object_storage.py": {
        "commit": "cfbb13b5b3b590b9a8104f1f3d480f0e21fa1fa3",
        "release": "main (touch(key, address, monotonic_id), close())",
    },
    "vllm/distributed/device_communicators/shm_broadcast.py": {
        "commit": "00c4c3f6785b601529004c5aaee29c5949128f2b",
        "release": "main (SpinCondition: shutdown(), dequeue(timeout, cancel, indefinite), "
                   "24 MiB chunks)",
    },
}

_SHM_BROADCAST = "vllm.distributed.device_communicators.shm_broadcast"
_SHM_OBJECT_STORAGE = "vllm.distributed.device_communicators.shm_object_storage"

# vLLM class (module, name) -> what replaces it and its recorded interface.
# A signature starting with "static " is a staticmethod's.
CLASSES = {
    (_SHM_BROADCAST, "MessageQueue"): {
        "dropin": ("shmbroker.queue", "MessageQueue"),
        "methods": {
            "__init__": "(self, n_reader, n_local_reader, local_reader_ranks=None, "
                        "max_chunk_bytes=25165824, max_chunks=10, connect_ip=None)",
            "export_handle": "(self)",
            "create_from_handle": "static (handle, rank)",
            "wait_until_ready": "(self)",
            "shutdown": "(self)",
            "acquire_write": "(self, timeout=None)",
            "acquire_read": "(self, timeout=None, cancel=None, indefinite=False)",
            "enqueue": "(self, obj, timeout=None)",
            "dequeue": "(self, timeout=None, cancel=None, indefinite=False)",
            "recv": "static (socket, timeout)",
            "broadcast_object": "(self, obj=None)",
            "create_from_process_group_single_reader":
                "static (pg, max_chunk_bytes, max_chunks, reader_rank=0, blocking=False)",
            "create_from_process_group":
                "static (pg, max_chunk_bytes, max_chunks, writer_rank=0, "
                "external_writer_handle=None, blocking=True)",
        },
        "internal": {},
    },
    (_SHM_OBJECT_STORAGE, "SingleWriterShmRingBuffer"): {
        "dropin": ("shmbroker.vllm", "SingleWriterShmRingBuffer"),
        "methods": {
            "__init__": "(self, data_buffer_size, name=None, create=False)",
            "handle": "(self)",
            "clear": "(self)",
            "close": "(self)",
            "int2byte": "(self, integer)",
            "byte2int": "(self, byte_data)",
            "allocate_buf": "(self, size)",
            "access_buf": "(self, address)",
            "free_buf": "(self, is_free_fn, nbytes=None)",
        },
        "internal": {},
    },
    (_SHM_OBJECT_STORAGE, "SingleWriterShmObjectStorage"): {
        "dropin": ("shmbroker.vllm", "SingleWriterShmObjectStorage"),
        "methods": {
            "__init__": "(self, max_object_size, n_readers, ring_buffer, serde_class=..., "
                        "reader_lock=None)",
            "clear": "(self)",
            "free_unused": "(self)",
            "is_cached": "(self, key)",
            "get_cached": "(self, key)",
            "put": "(self, key, value)",
            "get": "(self, address, monotonic_id)",
            "touch": "(self, key, address=0, monotonic_id=0)",
            "close": "(self)",
            "handle": "(self)",
            "create_from_handle": "static (handle)",
            "default_is_free_check": "(self, id, buf)",
        },
        # The writer's bookkeeping inside put() and get(): vLLM's callers
        # (the multimodal cache, the tests) never call them.
        "internal": {
            "copy_to_buffer": "(self, data, data_bytes, metadata, md_bytes, data_view)",
            "increment_writer_flag": "(self, id)",
            "increment_reader_flag": "(self, data_view)",
        },
    },
}

_CONSTANTS = (type(None), bool, int, float, str, bytes)


def _default_text(value):
    if type(value) in _CONSTANTS:
        return repr(value)
    return "..."


def signature_text(cls, name):
    """The recorded form of cls.name's signature ("static (a, b=1)" or
    "(self, a)"), None when cls has no such function."""
    try:
        raw = inspect.getattr_static(cls, name)
    except AttributeError:
        return None
    static = isinstance(raw, staticmethod)
    func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if not callable(func):
        return None
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    parts = []
    keyword_only_marked = False
    for p in sig.parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            parts.append("*" + p.name)
            keyword_only_marked = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append("**" + p.name)
            continue
        if p.kind is p.KEYWORD_ONLY and not keyword_only_marked:
            parts.append("*")
            keyword_only_marked = True
        text = p.name
        if p.default is not p.empty:
            text += "=" + _default_text(p.default)
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY:
            parts.append("/")
    # "/" goes once, after the last positional-only parameter.
    while parts.count("/") > 1:
        parts.remove("/")
    return ("static " if static else "") + "(" + ", ".join(parts) + ")"


def public_methods(cls):
    """The public functions cls defines or inherits (not from object), with
    __init__: names not starting with "_"."""
    names = set()
    for klass in inspect.getmro(cls):
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if name.startswith("_") and name != "__init__":
                continue
            func = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            if inspect.isfunction(func):
                names.add(name)
    return names


def _parse(text):
    """(static, [(name, kind, default text or None)]) of a recorded
    signature; kind is "pos", "kw", "*" or "**"."""
    static = text.startswith("static ")
    body = text[len("static "):] if static else text
    body = body.strip()[1:-1]
    params = []
    kind = "pos"
    for part in [p.strip() for p in body.split(",") if p.strip()]:
        if part == "/":
            continue
        if part == "*":
            kind = "kw"
        elif part.startswith("**"):
            params.append((part[2:], "**", None))
        elif part.startswith("*"):
            params.append((part[1:], "*", None))
            kind = "kw"
        else:
            name, _, default = part.partition("=")
            params.append((name, kind, default if _ else None))
    return static, params


def _accepts(theirs, ours):
    """Why a function of signature ours cannot take every call one of
    signature theirs takes; "" when it can."""
    t_static, t_params = _parse(theirs)
    o_static, o_params = _parse(ours)
    if t_static != o_static:
        return "is %sa staticmethod, vLLM's is %s" % ("" if o_static else "not ",
                                                       "one" if t_static else "not")
    for i, (name, kind, default) in enumerate(t_params):
        if i >= len(o_params):
            return "lacks parameter %r" % name
        o_name, o_kind, o_default = o_params[i]
        if (o_name, o_kind) != (name, kind):
            return "has %r where vLLM has %r" % (o_name, name)
        if default is not None and o_default is None and kind not in ("*", "**"):
            return "requires %s, which vLLM's does not" % name
        if default is not None and default != "..." and o_default != default:
            return "%s defaults to %s, vLLM's to %s" % (name, o_default, default)
    for name, kind, default in o_params[len(t_params):]:
        if kind in ("pos", "kw") and default is None:
            return "requires parameter %r, which vLLM's callers do not pass" % name
    return ""


def _load(module, name):
    return getattr(importlib.import_module(module), name)


def vllm_differences(key, cls):
    """What differs between vLLM's class cls (found installed) and the
    table's entry key, one sentence each; [] when nothing does."""
    entry = CLASSES[key]
    label = "%s.%s" % key
    recorded = dict(entry["methods"], **entry["internal"])
    found = public_methods(cls)
    out = []
    for name in sorted(found - set(recorded)):
        out.append("%s.%s%s is new (not in the recorded interface)"
                   % (label, name, signature_text(cls, name)))
    for name in sorted(set(recorded) - found):
        out.append("%s.%s is gone (recorded: %s)" % (label, name, recorded[name]))
    for name in sorted(found & set(recorded)):
        sig = signature_text(cls, name)
        if sig != recorded[name]:
            out.append("%s.%s is %s, recorded %s" % (label, name, sig, recorded[name]))
    return out


def dropin_differences(key, cls=None):
    """What keeps our drop-in (cls, else the table's "dropin") from taking
    every call vLLM's class takes, one sentence each; [] when nothing."""
    entry = CLASSES[key]
    if cls is None:
        cls = _load(*entry["dropin"])
    label = "%s.%s" % (cls.__module__, cls.__qualname__)
    out = []
    for name, theirs in entry["methods"].items():
        ours = signature_text(cls, name)
        if ours is None:
            out.append("%s.%s is missing (vLLM's: %s)" % (label, name, theirs))
            continue
        why = _accepts(theirs, ours)
        if why:
            out.append("%s.%s%s %s (vLLM's: %s)" % (label, name, ours, why, theirs))
    return out
