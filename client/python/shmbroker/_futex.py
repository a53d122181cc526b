"""Futex waits and the few atomic operations a queue member needs, from Python.

The queue's words live in a MAP_SHARED area that other processes (C or
Python members, and the daemon) read and write at the same time. Plain loads
and stores go through memoryview casts (queue.py): on x86-64 an aligned 4- or
8-byte access is one instruction, and the memory model (TSO) gives every load
acquire and every store release ordering, which is all proto/queue.c asks of
them. What a memoryview cannot do is a read-modify-write that no other
process can split: the shared counters (readers_waiting, head_word,
free_word), the seat's waiting flag (which the daemon exchanges too) and the
compare-and-swap of a seat's next (which the daemon's seat_take may race).
ctypes has no atomics and libc exports none, so this module writes three
tiny x86-64 functions (lock xadd, xchg, lock cmpxchg: 6 to 9 bytes each) into
a page of its own, makes the page read-and-execute, and calls them through
ctypes. No compiler, no extension module, nothing to build at install.
Where a policy forbids executable memory (systemd's MemoryDenyWriteExecute=,
SELinux's execmem), the same operations come from GCC's libatomic
(libatomic.so.1, Debian's libatomic1) when it is installed: lock-free for
these sizes on x86-64, so they are the same instructions, called through a
function of the library instead.

Futexes are libc's syscall(SYS_futex, ...) through ctypes, which releases
the GIL while the call sleeps. FUTEX_WAIT_BITSET takes an absolute
CLOCK_MONOTONIC deadline (time.monotonic_ns's clock), so a spurious return
does not stretch a timeout. Not FUTEX_PRIVATE_FLAG: the word is shared
between processes.

Other architectures are refused (Unsupported) rather than run with orderings
nobody checked: their loads and stores would need explicit fences and their
own machine code.
"""

import ctypes
import errno as _errno
import mmap
import os
import platform

from .errors import Unsupported

__all__ = ["supported", "why_unsupported", "fetch_add32", "exchange32", "cas64",
           "futex_wait", "futex_wake", "INT_MAX"]

INT_MAX = 0x7FFFFFFF
_SYS_FUTEX = 202  # x86-64
_FUTEX_WAKE = 1
_FUTEX_WAIT_BITSET = 9
_FUTEX_BITSET_MATCH_ANY = 0xFFFFFFFF

# SysV x86-64: arguments in rdi, rsi, rdx; the result in rax. Every locked
# instruction (and xchg with memory) is also a full fence, which stands for
# the seq_cst fences proto/queue.c puts after its announcements.
_CODE = {
    # uint32_t fetch_add32(uint32_t *p, uint32_t v): mov eax,esi; lock xadd [rdi],eax; ret
    "fetch_add32": bytes.fromhex("89f0f00fc107c3"),
    # uint32_t exchange32(uint32_t *p, uint32_t v): mov eax,esi; xchg [rdi],eax; ret
    "exchange32": bytes.fromhex("89f08707c3"),
    # uint64_t cas64(uint64_t *p, uint64_t expected, uint64_t desired):
    #   mov rax,rsi; lock cmpxchg [rdi],rdx; ret   (returns the old value)
    "cas64": bytes.fromhex("4889f0f0480fb117c3"),
}
_TYPES = {
    "fetch_add32": (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32),
    "exchange32": (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32),
    "cas64": (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64),
}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load():
    """The atomic functions and the futex call, or the reason there are none."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None, ("The Python queue data path runs on x86-64 only (this is %s): its "
                      "plain loads and stores rely on x86-64's ordering (TSO). Use the C "
                      "library's shmb_queue_* here." % (machine or "an unknown machine"))
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    syscall.argtypes = (ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32)
    mprotect = libc.mprotect
    mprotect.restype = ctypes.c_int
    mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE)
    funcs = {}
    pos = 0
    layout = []
    for name, code in _CODE.items():
        page[pos:pos + len(code)] = code
        layout.append((name, pos))
        pos = (pos + len(code) + 15) & ~15
    anchor = ctypes.c_char.from_buffer(page)
    base = ctypes.addressof(anchor)
    # Written, then read-and-execute only: never writable and executable at once.
    if mprotect(base, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        err = ctypes.get_errno()
        del anchor
        page.close()
        funcs = _load_libatomic()
        if funcs is None:
            return None, ("The Python queue data path needs a page of executable memory "
                          "for its atomic operations, and mprotect refused it (%s): a "
                          "policy forbids executable memory here, and there is no "
                          "libatomic.so.1 to use instead (Debian: apt install libatomic1). "
                          "Or use the C library's shmb_queue_*." % os.strerror(err))
        funcs["syscall"] = syscall
        return funcs, None
    for name, off in layout:
        restype, *argtypes = _TYPES[name]
        # PYFUNCTYPE: a few instructions, no reason to let go of the GIL.
        funcs[name] = ctypes.PYFUNCTYPE(restype, *argtypes)(base + off)
    # The page and its export stay for the life of the process (the
    # functions point into it; a forked child inherits it).
    funcs["_keep"] = (page, anchor)
    funcs["syscall"] = syscall
    return funcs, None


_SEQ_CST = 5  # __ATOMIC_SEQ_CST


def _load_libatomic():
    """fetch_add32, exchange32 and cas64 from GCC's libatomic, or None when
    it is not installed."""
    try:
        lib = ctypes.CDLL("libatomic.so.1")
        add, xchg = lib.__atomic_fetch_add_4, lib.__atomic_exchange_4
        cmpxchg = lib.__atomic_compare_exchange_8
    except (OSError, AttributeError):
        return None
    add.restype = xchg.restype = ctypes.c_uint32
    add.argtypes = xchg.argtypes = (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int)
    cmpxchg.restype = ctypes.c_bool
    cmpxchg.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64,
                        ctypes.c_int, ctypes.c_int)

    def cas64(p, expected, desired):
        # Returns the old value, as the machine-code version does.
        old = ctypes.c_uint64(expected)
        cmpxchg(p, ctypes.byref(old), desired, _SEQ_CST, _SEQ_CST)
        return old.value

    return {"fetch_add32": lambda p, v: add(p, v, _SEQ_CST),
            "exchange32": lambda p, v: xchg(p, v, _SEQ_CST),
            "cas64": cas64}


_funcs, why_unsupported = _load()
supported = _funcs is not None


def _refuse(*_args):
    raise Unsupported("ENOSYS", why_unsupported)


if supported:
    fetch_add32 = _funcs["fetch_add32"]
    exchange32 = _funcs["exchange32"]
    cas64 = _funcs["cas64"]
    _syscall = _funcs["syscall"]
else:
    fetch_add32 = exchange32 = cas64 = _syscall = _refuse


def futex_wait(addr, val, deadline_ns=None):
    """Sleep while the 32-bit word at addr holds val, until woken or the
    CLOCK_MONOTONIC deadline in nanoseconds (None: none). Any return means
    "look again": woken, the value changed, a signal, or the deadline."""
    if deadline_ns is None:
        ts = None
    else:
        ts = ctypes.byref(_Timespec(deadline_ns // 1000000000, deadline_ns % 1000000000))
    if _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT_BITSET, val, ts, None,
                _FUTEX_BITSET_MATCH_ANY) < 0:
        err = ctypes.get_errno()
        if err not in (_errno.EAGAIN, _errno.EINTR, _errno.ETIMEDOUT):
            raise OSError(err, "futex wait: %s" % os.strerror(err))


def futex_wake(addr, n):
    """Wake up to n sleepers on the word at addr."""
    _syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, n, None, None, 0)


def anchor(buf):
    """A ctypes object over the start of buf (a writable mmap): while it
    lives, buf cannot be unmapped under the addresses taken from it."""
    return ctypes.c_char.from_buffer(buf)


def address(anchored):
    """The address of the mapping an anchor() holds."""
    return ctypes.addressof(anchored)
