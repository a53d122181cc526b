# SPDX-License-Identifier: Apache-2.0
"""The Python queue data path on a machine without x86-64's ordering.

proto/queue.c loads some words with acquire order (head, the seats' next)
and stores head with release order. On x86-64 (TSO) a plain load or store
already has that order; on aarch64 _futex gives fences, and queue.py must
call them in the right places: the release fence after the slot is written
and before head is stored, an acquire fence after the last load of head
before the reader reads the slot, and after the last load of a seat's next
before the writer overwrites a slot. qemu on an x86-64 host keeps the
host's order, so a missing fence would pass there: these tests record, on
any machine, where the fences fall among the area's loads and stores.
"""

import os
import sys
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE_DIR = os.path.join(ROOT, "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

from shmbroker import _futex, queue as Q  # noqa: E402

import test_queues as TQ  # noqa: E402  (the area laid out by hand)

HEAD = Q.HEADER_OFFSETS["head"]


def seat_next_at(seat):
    return Q.HEADER_PAGE + seat * Q.SEAT_SIZE + Q.SEAT_OFFSETS["next"]


class Words:
    """A stand-in for an area's word view (_q32, _q64) that logs each load
    and store, by byte offset, into log."""

    def __init__(self, view, width, log):
        self.view, self.width, self.log = view, width, log

    def __getitem__(self, i):
        self.log.append(("load", i * self.width))
        return self.view[i]

    def __setitem__(self, i, v):
        self.log.append(("store", i * self.width))
        self.view[i] = v


class TestFenceTable(unittest.TestCase):
    """Which machines get which system call and fences."""

    def test_machines(self):
        """x86-64 is TSO with futex 202; aarch64 (also called arm64) needs
        fences and has futex 98; anything else has no code here."""
        for name in ("x86_64", "AMD64"):
            machine, spec = _futex.arch(name)
            self.assertEqual((machine, spec["sys_futex"], spec["tso"]), ("x86_64", 202, True))
        for name in ("aarch64", "arm64"):
            machine, spec = _futex.arch(name)
            self.assertEqual((machine, spec["sys_futex"], spec["tso"]), ("aarch64", 98, False))
            self.assertEqual(set(spec["code"]), {"fetch_add32", "exchange32", "cas64",
                                                 "fence_acquire", "fence_release"})
        self.assertEqual(_futex.arch("riscv64"), ("riscv64", None))

    def test_aarch64_code_fences(self):
        """aarch64's functions, word by word: each read-modify-write
        returns only after a dmb ish (a full fence, which queue.py counts
        on after its announcements), the acquire fence is dmb ishld and the
        release fence dmb ish. qemu cannot show a missing barrier; this
        can."""
        dmb_ish, dmb_ishld, ret = "bf3b03d5", "bf3903d5", "c0035fd6"
        code = _futex.arch("aarch64")[1]["code"]
        for name in ("fetch_add32", "exchange32", "cas64"):
            words = [code[name][i:i + 8] for i in range(0, len(code[name]), 8)]
            rets = [i for i, w in enumerate(words) if w == ret]
            self.assertTrue(rets, name)
            for i in rets:
                self.assertIn(dmb_ish, words[max(0, i - 2):i], "%s: ret at word %d" % (name, i))
        self.assertEqual(code["fence_acquire"], dmb_ishld + ret)
        self.assertEqual(code["fence_release"], dmb_ish + ret)

    def test_libatomic_fences(self):
        """Where executable memory is refused, libatomic stands in: on
        aarch64 with its fences too, on x86-64 with none (TSO)."""
        lib = _futex._load_libatomic("aarch64")
        if lib is None:
            self.skipTest("no libatomic.so.1 here (Debian: libatomic1)")
        lib["fence_acquire"]()
        lib["fence_release"]()
        self.assertNotIn("fence_acquire", _futex._load_libatomic("x86_64"))

    def test_this_machine(self):
        """This machine's fences are None exactly where it is TSO, callable
        elsewhere; its futex call is its own number."""
        if not _futex.supported:
            self.skipTest(_futex.why_unsupported)
        machine, spec = _futex.arch()
        self.assertEqual(_futex.machine, machine)
        self.assertEqual(_futex._SYS_FUTEX, spec["sys_futex"])
        if spec["tso"]:
            self.assertIsNone(_futex.fence_acquire)
            self.assertIsNone(_futex.fence_release)
        else:
            _futex.fence_acquire()
            _futex.fence_release()


@unittest.skipUnless(_futex.supported, _futex.why_unsupported or "")
class TestWeakOrdering(unittest.TestCase):
    """The area with fences forced on (as on aarch64), recorded."""

    def setUp(self):
        self.log = []
        self.at_release = []
        log = self.log

        def acquire():
            log.append(("acquire",))

        def release():
            log.append(("release",))
            # What is in memory when the release comes: head not yet
            # stored, the slot already filled.
            self.at_release.append(self.snapshot())

        for name, fn in (("fence_acquire", acquire), ("fence_release", release)):
            patch = unittest.mock.patch.object(_futex, name, fn)
            patch.start()
            self.addCleanup(patch.stop)
        self.fd, self.size = TQ.format_area(1, 2, 64)
        self.addCleanup(os.close, self.fd)
        self.writer = self.attach()
        self.reader = self.attach(0, TQ.seat_take(self.writer, 0))
        self.raw = self.writer._mv

    def attach(self, seat=None, epoch=0):
        area = TQ.attach(self.fd, self.size, seat, epoch)
        self.addCleanup(area.close)
        self.assertIsNotNone(area._acquire)
        q64, q32 = area._q64, area._q32
        area._q64, area._q32 = Words(q64, 8, self.log), Words(q32, 4, self.log)

        def restore():
            area._q64, area._q32 = q64, q32
        self.addCleanup(restore)
        return area

    def snapshot(self):
        """head, and the seq, length and first payload byte of slot 0."""
        seq, _flags, length = Q.SLOT.unpack_from(self.raw, self.writer.slots_offset)[:3]
        return (self.writer._q64.view[HEAD // 8], seq, length,
                self.raw[self.writer.slots_offset + Q.SLOT_HEADER])

    def send(self, byte):
        payload = self.writer.reserve(0)[0]
        payload[0] = byte
        payload.release()
        self.writer.publish(Q.SLOT_INLINE, 1)

    def after(self, event, start):
        """Events after the last `event` from log[start:]."""
        tail = self.log[start:]
        last = max(i for i, e in enumerate(tail) if e == event)
        return tail[last + 1:]

    def test_release_before_head(self):
        """publish: the release fence comes after the slot is written and
        right before head is stored, with nothing stored between."""
        self.send(0xAB)
        stores = [i for i, e in enumerate(self.log) if e == ("store", HEAD)]
        self.assertEqual(len(stores), 1)
        before = self.log[:stores[0]]
        self.assertIn(("release",), before)
        between = before[len(before) - before[::-1].index(("release",)):]
        self.assertFalse([e for e in between if e[0] == "store"], between)
        self.assertEqual(self.at_release, [(0, 0, 1, 0xAB)])

    def test_acquire_after_head(self):
        """dequeue: an acquire fence after the last load of head, before
        the slot is read (dequeue returns it)."""
        self.send(7)
        start = len(self.log)
        flags, payload, _aux = self.reader.dequeue(0)
        self.assertEqual((flags, bytes(payload)), (Q.SLOT_INLINE, b"\x07"))
        payload.release()
        self.assertIn(("acquire",), self.after(("load", HEAD), start))

    def test_acquire_after_seat_next(self):
        """reserve of a slot used before: an acquire fence after the last
        load of the seat's next, before the slot is overwritten."""
        self.send(1)
        self.send(2)
        for _ in range(2):
            self.reader.dequeue(0)[1].release()
        self.reader.done()
        start = len(self.log)
        self.writer.reserve(0)[0].release()
        self.assertIn(("acquire",), self.after(("load", seat_next_at(0)), start))


if __name__ == "__main__":
    unittest.main()
