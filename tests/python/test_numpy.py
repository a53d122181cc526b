# SPDX-License-Identifier: Apache-2.0
"""numpy over the segment without copies: arrays on pinned bytes share the
mapping, arrays are written in place through alloc(), a 64 MiB array goes
from one process to another with one copy, and releasing a pin under a live
array does not crash. Skipped when numpy is absent."""

import unittest

import support

try:
    import numpy as np
except ImportError:
    np = None

NO_NUMPY = "numpy is not installed (Debian: python3-numpy)"


@unittest.skipIf(np is None, NO_NUMPY)
class TestNumpy(support.DaemonTest):
    DAEMON_SIZE = "160M"

    def whole(self, client=None):
        """An array over the whole mapping, to test sharing against."""
        return np.frombuffer((client or self.c)._mv, dtype=np.uint8)

    def test_read_is_zero_copy(self):
        src = np.arange(1000, dtype=np.float64)
        self.c.put("a", src)
        with self.c.get("a") as pin:
            arr = np.frombuffer(pin.view, dtype=np.float64)
            self.assertTrue(np.shares_memory(arr, self.whole()))
            self.assertFalse(arr.flags.writeable)
            self.assertTrue(np.array_equal(arr, src))
            self.assertEqual(arr.ctypes.data % 64, 0)
            del arr

    def test_write_in_place(self):
        with self.c.alloc("w", 8 * 100) as a:
            arr = np.frombuffer(a.view, dtype=np.int64)
            self.assertTrue(np.shares_memory(arr, self.whole()))
            arr[:] = np.arange(100) * 3
            del arr
        self.assertTrue(np.array_equal(np.frombuffer(self.c.read("w"), dtype=np.int64),
                                       np.arange(100) * 3))

    def test_frames_of_arrays(self):
        a, b = np.ones(10, dtype=np.float32), np.arange(7, dtype=np.int16)
        self.c.put("f", [a, b])
        with self.c.get_frames("f") as pin:
            x = np.frombuffer(pin.frames[0], dtype=np.float32)
            y = np.frombuffer(pin.frames[1], dtype=np.int16)
            self.assertTrue(np.array_equal(x, a) and np.array_equal(y, b))
            self.assertTrue(np.shares_memory(y, self.whole()))
            self.assertEqual(y.ctypes.data % 64, 0)
            del x, y

    def test_empty_arrays(self):
        """Arrays of no bytes (a zero in the shape) are frames of 0 bytes,
        alone or among others."""
        empty = np.zeros((0, 3), np.uint8)
        self.c.put("e", [b"x", empty, np.arange(3, dtype=np.uint8)])
        self.assertEqual(self.c.read_frames("e"), [b"x", b"", b"\x00\x01\x02"])
        with self.assertRaises(ValueError):
            self.c.put("only-empty", empty)  # an object holds at least one byte

    def test_release_with_live_array(self):
        """Releasing a pin while an array still uses its view: no crash; the
        pin goes in the daemon, the array stays readable (its memory stays
        mapped), the bytes are no longer protected, and the mapping is kept
        even after close() until the array goes."""
        self.c.put("r", np.full(1000, 7, dtype=np.uint8))
        pin = self.c.get("r")
        arr = np.frombuffer(pin.view, dtype=np.uint8)
        pin.release()
        self.assertTrue(pin.released)
        self.assertEqual(self.c.stats()["pinned"], 0)
        self.assertEqual(int(arr.sum()), 7000)
        self.c.delete("r")
        self.c.put("next", np.full(1000, 9, dtype=np.uint8))
        self.c.close()
        self.assertIn(int(arr[0]), (7, 9))  # mapped still; whatever the segment holds
        del arr

    def test_64mib_one_copy_between_processes(self):
        """A writer process fills a 64 MiB array in place (no copy), the
        reader maps it (no copy) and makes the one copy: its np.array(...)."""
        n = 64 << 20
        child = support.child_python(
            "import sys, numpy as np, shmbroker\n"
            "c = shmbroker.Client(sys.argv[1])\n"
            "with c.alloc('big', %d) as a:\n"
            "    arr = np.frombuffer(a.view, dtype=np.uint8)\n"
            "    whole = np.frombuffer(c._mv, dtype=np.uint8)\n"
            "    assert np.shares_memory(arr, whole)\n"
            "    arr[:] = np.arange(%d, dtype=np.uint64).astype(np.uint8)\n"
            "    del arr, whole\n"
            "print('written', flush=True)\n"
            "sys.stdin.read()\n" % (n, n), self.d.socket_path)
        self.addCleanup(lambda: (child.stdin.close(), child.wait(), child.stdout.close(),
                                 child.stderr.close()))
        line = child.stdout.readline()
        self.assertEqual(line.strip(), b"written", child.stderr.read() if not line else "")
        reader = self.d.client(read_only=True)
        self.addCleanup(reader.close)
        with reader.get("big") as pin:
            view = np.frombuffer(pin.view, dtype=np.uint8)
            self.assertTrue(np.shares_memory(view, self.whole(reader)))  # no copy to read
            copy = np.array(view)  # the one copy
            self.assertFalse(np.shares_memory(copy, self.whole(reader)))
            del view
        self.assertEqual(copy.nbytes, n)
        self.assertTrue(np.array_equal(copy[:512], np.arange(512, dtype=np.uint64)
                                       .astype(np.uint8)))
        self.assertEqual(int(copy[n - 1]), (n - 1) % 256)
