# SPDX-License-Identifier: Apache-2.0
"""Futex waits and the few atomic operations a queue member needs, from Python.

The queue's words live in a MAP_SHARED area that other processes (C or
Python members, and the daemon) read and write at the same time. Plain loads
and stores go through memoryview casts (queue.py): an aligned 4- or 8-byte
access is one instruction on a 64-bit machine, as a relaxed atomic access
compiles to. What proto/queue.c loads with acquire or stores with release
order needs more on a machine that reorders memory accesses:

- x86-64 (TSO): every load is already an acquire and every store a release,
  so fence_acquire and fence_release are None and nothing is called.
- aarch64 (weakly ordered): queue.py calls fence_acquire() right after such
  a load (a relaxed load followed by an acquire fence is an acquire load)
  and fence_release() right before such a store (a release fence followed
  by a relaxed store is a release store): dmb ishld and dmb ish.

What a memoryview cannot do is a read-modify-write that no other process can
split: the shared counters (readers_waiting, head_word, free_word), the
seat's waiting flag (which the daemon exchanges too), the compare-and-swap
of a seat's next (which the daemon's seat_take may race) and of a catalog
seal (the read-write client's read counting). Each of them is also a full
fence here, which stands for the seq_cst fences proto/queue.c puts after its
announcements: on x86-64 a locked instruction is one; on aarch64 the
exclusive load-store loop (acquire and release) ends with dmb ish, as GCC's
__sync builtins do.

ctypes has no atomics and libc exports none, so this module writes these
tiny functions (3 to 14 instructions each) in the machine's code into a
page of its own, makes the page read-and-execute, and calls them through
ctypes. No compiler, no extension module, nothing to build at install. On
aarch64 the instruction cache needs no flush from here: the page is written
while it is not executable, and the kernel makes the caches agree when
mprotect maps it executable (arm64's set_pte_at syncs a page it has not
seen executable). Where a policy forbids executable memory (systemd's
MemoryDenyWriteExecute=, SELinux's execmem), the same operations come from
GCC's libatomic (libatomic.so.1, Debian's libatomic1) when it is installed,
with its atomic_thread_fence for the fences (and a seq_cst one after each
read-modify-write where that is not already a full fence).

Futexes are libc's syscall(SYS_futex, ...) through ctypes, which releases
the GIL while the call sleeps; SYS_futex is 202 on x86-64 and 98 on
aarch64. FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline
(time.monotonic_ns's clock), so a spurious return does not stretch a
timeout. Not FUTEX_PRIVATE_FLAG: the word is shared between processes.

Other architectures (and 32-bit Pythons) are refused (Unsupported) rather
than run with orderings nobody checked: they would need machine code and
system call numbers of their own.
"""

import ctypes
import functools
import errno as _errno
import mmap
import os
import platform

from .errors import Unsupported

__all__ = ["supported", "why_unsupported", "machine", "fetch_add32", "exchange32", "cas64",
           "fence_acquire", "fence_release", "futex_wait", "futex_wake", "timer_slack",
           "bind", "INT_MAX"]

INT_MAX = 0x7FFFFFFF
_FUTEX_WAKE = 1
_FUTEX_WAIT_BITSET = 9
_FUTEX_BITSET_MATCH_ANY = 0xFFFFFFFF

# What each supported machine needs: the futex system call's number, the
# functions' code, and whether its plain loads and stores are ordered (TSO:
# no fences). platform.machine()'s other names for them map here.
_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
_ARCH = {
    "x86_64": {
        "sys_futex": 202,
        "tso": True,
        # SysV x86-64: arguments in rdi, rsi, rdx; the result in rax. Every
        # locked instruction (and xchg with memory) is also a full fence.
        "code": {
            # uint32_t fetch_add32(uint32_t *p, uint32_t v): mov eax,esi; lock xadd [rdi],eax; ret
            "fetch_add32": "89f0f00fc107c3",
            # uint32_t exchange32(uint32_t *p, uint32_t v): mov eax,esi; xchg [rdi],eax; ret
            "exchange32": "89f08707c3",
            # uint64_t cas64(uint64_t *p, uint64_t expected, uint64_t desired):
            #   mov rax,rsi; lock cmpxchg [rdi],rdx; ret   (returns the old value)
            "cas64": "4889f0f0480fb117c3",
        },
    },
    "aarch64": {
        "sys_futex": 98,
        "tso": False,
        # AAPCS64: arguments in x0, x1, x2; the result in x0/w0. ARMv8.0's
        # exclusives (no LSE atomics needed), little-endian words. Every
        # read-modify-write ends with dmb ish: a full fence, as on x86-64.
        "code": {
            # fetch_add32: 1: ldaxr w2,[x0]; add w3,w2,w1; stlxr w4,w3,[x0];
            #   cbnz w4,1b; dmb ish; mov w0,w2; ret
            "fetch_add32": "02fc5f884300010b03fc0488a4ffff35bf3b03d5e003022ac0035fd6",
            # exchange32: 1: ldaxr w2,[x0]; stlxr w3,w1,[x0]; cbnz w3,1b;
            #   dmb ish; mov w0,w2; ret
            "exchange32": "02fc5f8801fc0388c3ffff35bf3b03d5e003022ac0035fd6",
            # cas64: 1: ldaxr x3,[x0]; cmp x3,x1; b.ne 2f; stlxr w4,x2,[x0];
            #   cbnz w4,1b; dmb ish; mov x0,x3; ret
            #   2: clrex; dmb ish; mov x0,x3; ret   (returns the old value)
            "cas64": "03fc5fc87f0001ebc100005402fc04c884ffff35bf3b03d5e00303aac0035fd6"
                     "5f3f03d5bf3b03d5e00303aac0035fd6",
            # fence_acquire: dmb ishld (earlier loads before later loads and stores); ret
            "fence_acquire": "bf3903d5c0035fd6",
            # fence_release: dmb ish (earlier loads and stores before later stores); ret
            "fence_release": "bf3b03d5c0035fd6",
        },
    },
}
_TYPES = {
    "fetch_add32": (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32),
    "exchange32": (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_uint32),
    "cas64": (ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64),
    "fence_acquire": (None,),
    "fence_release": (None,),
}


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def arch(name=None):
    """(machine, what it needs) for this machine (or name, as
    platform.machine() spells it), or (machine, None) when it is not one
    this module has code for."""
    name = (name if name is not None else platform.machine()).lower()
    name = _ALIASES.get(name, name)
    return name, _ARCH.get(name)


def _load():
    """The atomic functions, the fences and the futex call, or the reason
    there are none."""
    name, spec = arch()
    if spec is None or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None, ("The Python queue data path runs on x86-64 and aarch64 (64-bit) only "
                      "(this is %s%s): it needs machine code for its atomics and the "
                      "machine's futex system call. Use the C library's shmb_queue_* here."
                      % (name or "an unknown machine",
                         ", a 32-bit Python" if spec is not None else ""))
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
    for fname, hexcode in spec["code"].items():
        code = bytes.fromhex(hexcode)
        page[pos:pos + len(code)] = code
        layout.append((fname, pos))
        pos = (pos + len(code) + 15) & ~15
    anchor = ctypes.c_char.from_buffer(page)
    base = ctypes.addressof(anchor)
    # Written, then read-and-execute only: never writable and executable at once.
    if mprotect(base, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
        err = ctypes.get_errno()
        del anchor
        page.close()
        funcs = _load_libatomic(name)
        if funcs is None:
            return None, ("The Python queue data path needs a page of executable memory "
                          "for its atomic operations, and mprotect refused it (%s): a "
                          "policy forbids executable memory here, and there is no "
                          "libatomic.so.1 to use instead (Debian: apt install libatomic1). "
                          "Or use the C library's shmb_queue_*." % os.strerror(err))
    else:
        for fname, off in layout:
            restype, *argtypes = _TYPES[fname]
            # PYFUNCTYPE: a few instructions, no reason to let go of the GIL.
            funcs[fname] = ctypes.PYFUNCTYPE(restype, *argtypes)(base + off)
        # The page and its export stay for the life of the process (the
        # functions point into it; a forked child inherits it).
        funcs["_keep"] = (page, anchor)
        funcs["_code_pages"] = True  # bind() may write pages of its own
    if spec["tso"]:
        funcs["fence_acquire"] = funcs["fence_release"] = None
    funcs["syscall"] = syscall
    funcs["sys_futex"] = spec["sys_futex"]
    prctl = libc.prctl
    prctl.restype = ctypes.c_int
    prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong)
    funcs["prctl"] = prctl
    funcs["mprotect"] = mprotect
    return funcs, None


_SEQ_CST = 5  # __ATOMIC_SEQ_CST
_ACQUIRE = 2  # __ATOMIC_ACQUIRE
_RELEASE = 3  # __ATOMIC_RELEASE


def _load_libatomic(machine=None, library="libatomic.so.1"):
    """fetch_add32, exchange32 and cas64 from GCC's libatomic, and on a
    machine that is not TSO (machine: platform.machine()'s name, by default
    this one's) its fences too, or None when it is not installed."""
    machine = arch(machine)[0]
    try:
        lib = ctypes.CDLL(library)
        add, xchg = lib.__atomic_fetch_add_4, lib.__atomic_exchange_4
        cmpxchg = lib.__atomic_compare_exchange_8
        thread_fence = lib.atomic_thread_fence
    except (OSError, AttributeError):
        return None
    add.restype = xchg.restype = ctypes.c_uint32
    add.argtypes = xchg.argtypes = (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int)
    cmpxchg.restype = ctypes.c_bool
    cmpxchg.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64,
                        ctypes.c_int, ctypes.c_int)
    thread_fence.restype = None
    thread_fence.argtypes = (ctypes.c_int,)
    tso = _ARCH.get(machine, {}).get("tso", False)

    def full_fence():
        # A seq_cst read-modify-write is a full fence on x86-64 (a locked
        # instruction), not necessarily elsewhere (an LSE swpal orders the
        # accesses around it only as acquire and release do).
        if not tso:
            thread_fence(_SEQ_CST)

    def fetch_add32(p, v):
        old = add(p, v, _SEQ_CST)
        full_fence()
        return old

    def exchange32(p, v):
        old = xchg(p, v, _SEQ_CST)
        full_fence()
        return old

    def cas64(p, expected, desired):
        # Returns the old value, as the machine-code version does.
        old = ctypes.c_uint64(expected)
        cmpxchg(p, ctypes.byref(old), desired, _SEQ_CST, _SEQ_CST)
        full_fence()
        return old.value

    funcs = {"fetch_add32": fetch_add32, "exchange32": exchange32, "cas64": cas64}
    if not tso:
        funcs["fence_acquire"] = lambda: thread_fence(_ACQUIRE)
        funcs["fence_release"] = lambda: thread_fence(_RELEASE)
    return funcs


machine = arch()[0]
_funcs, why_unsupported = _load()
supported = _funcs is not None


def _refuse(*_args):
    raise Unsupported("ENOSYS", why_unsupported)


if supported:
    fetch_add32 = _funcs["fetch_add32"]
    exchange32 = _funcs["exchange32"]
    cas64 = _funcs["cas64"]
    # None where plain loads and stores are already ordered (x86-64).
    fence_acquire = _funcs["fence_acquire"]
    fence_release = _funcs["fence_release"]
    _syscall = _funcs["syscall"]
    _SYS_FUTEX = _funcs["sys_futex"]
    _prctl = _funcs["prctl"]
else:
    fetch_add32 = exchange32 = cas64 = _syscall = _prctl = _refuse
    fence_acquire = fence_release = None
    _SYS_FUTEX = None


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


_PR_SET_TIMERSLACK = 29
_PR_GET_TIMERSLACK = 30


def timer_slack(ns=None):
    """The calling thread's timer slack in nanoseconds (how late the kernel
    may end its timed sleeps, 50 us by default): returns the current one
    (-1 when prctl is refused), and sets ns when given (0 gives the
    thread's default back; a negative ns, or a refused prctl, sets
    nothing)."""
    old = _prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    # Refused (a seccomp filter): nothing is set, and -1 is never given
    # back as a slack (it would be read as 2^64 - 1 ns).
    if ns is not None and old >= 0 and ns >= 0:
        _prctl(_PR_SET_TIMERSLACK, ns, 0, 0, 0)
    return old


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


# ---- operations on fixed words -------------------------------------------------------
#
# A ctypes call costs about 80 ns plus 100 ns or more per argument it
# converts, several times the locked instruction itself: fetch_add32's two
# arguments and cas64's three are most of a queue member's atomic
# operations' cost, paid on every message. The words a member bumps or
# swaps on every message are fixed once its area is mapped (the writer's
# head_word, a reader's seat next), so bind() writes their addresses into
# the code of functions of their own: one that adds a fixed value and takes
# no argument, one that swaps in its argument plus one and takes only that.
# x86-64 only, where the code pages of _load are allowed; elsewhere (aarch64,
# whose moves of a 64-bit constant are not written here, or libatomic) bind()
# gives the same operations through the generic functions.

# movabs rdi, <addr>; mov eax, <value>; lock xadd [rdi], eax; ret
_ADD32_CODE = ("48bf", "b8", "f00fc107c3")
# mov rax, rdi; lea rdx, [rax+1]; movabs rdi, <addr>; lock cmpxchg [rdi], rdx; ret
_CAS_NEXT64_CODE = ("4889f8488d5001" "48bf", "f0480fb117c3")


# Whether _load wrote its functions into a page of its own (not libatomic's):
# bind() writes pages of its own only then.
code_pages = supported and bool(_funcs.get("_code_pages"))


class Bound:
    """Atomic operations on fixed words (bind()): add32() adds the value
    bound to its word and returns the old value; cas_next64(expected) sets
    its word to expected + 1 where it holds expected and returns the old
    value. Each is a full fence, as fetch_add32 and cas64 are. The caller
    keeps the words mapped while it may call them; the Bound keeps its code."""

    __slots__ = ("add32", "cas_next64", "machine_code", "_page")


def bind(add_addr=None, add_value=1, cas_addr=None):
    """A Bound whose add32 adds add_value (a 32-bit value) to the 32-bit
    word at add_addr and whose cas_next64 swaps the 64-bit word at cas_addr
    (either may be None: that operation is then None)."""
    b = Bound()
    b.machine_code = False
    b._page = None
    if machine == "x86_64" and code_pages:
        try:
            page = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError:
            page = None
        if page is not None:
            code = b""
            at = {}
            if add_addr is not None:
                at["add32"] = len(code)
                code += (bytes.fromhex(_ADD32_CODE[0]) + add_addr.to_bytes(8, "little")
                         + bytes.fromhex(_ADD32_CODE[1])
                         + (add_value & 0xFFFFFFFF).to_bytes(4, "little")
                         + bytes.fromhex(_ADD32_CODE[2]))
                code += bytes(-len(code) % 16)
            if cas_addr is not None:
                at["cas_next64"] = len(code)
                code += (bytes.fromhex(_CAS_NEXT64_CODE[0]) + cas_addr.to_bytes(8, "little")
                         + bytes.fromhex(_CAS_NEXT64_CODE[1]))
            page[:len(code)] = code
            anchored = ctypes.c_char.from_buffer(page)
            base = ctypes.addressof(anchored)
            # Written, then read-and-execute only, as _load's page.
            if _funcs["mprotect"](base, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC) == 0:
                b.add32 = (ctypes.PYFUNCTYPE(ctypes.c_uint32)(base + at["add32"])
                           if add_addr is not None else None)
                b.cas_next64 = (ctypes.PYFUNCTYPE(ctypes.c_uint64, ctypes.c_uint64)(
                    base + at["cas_next64"]) if cas_addr is not None else None)
                b.machine_code = True
                b._page = (page, anchored)
                return b
            del anchored
            page.close()
    b.add32 = (functools.partial(fetch_add32, add_addr, add_value)
               if add_addr is not None else None)
    b.cas_next64 = ((lambda expected: cas64(cas_addr, expected, expected + 1))
                    if cas_addr is not None else None)
    return b
