# SPDX-License-Identifier: Apache-2.0
"""shmbroker.dumps_into / loads_from: pickle protocol 5 into one frames
payload, read back copying or zero-copy, the zero-copy pin living exactly as
long as the objects made over it."""

import gc
import os
import pickle
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

import shmbroker  # noqa: E402
from shmbroker import frames, pickling  # noqa: E402

try:
    import numpy as np
except ImportError:
    np = None


class Blob:
    """An object that pickles its data out of band from protocol 5 on, as
    numpy arrays do, and in the stream below it."""

    def __init__(self, data):
        self.data = data

    def __reduce_ex__(self, protocol):
        if protocol >= 5:
            return Blob, (pickle.PickleBuffer(self.data),)
        return Blob, (bytes(self.data),)


class PicklingTest(unittest.TestCase):
    """A private daemon per test class, a client per test."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = shmbroker.spawn_daemon("8M")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def setUp(self):
        self.c = shmbroker.Client(self.daemon.socket_path, name="test_pickling")
        self.addCleanup(self.c.close)
        self.addCleanup(self.clean_keys)

    def clean_keys(self):
        with shmbroker.Client(self.daemon.socket_path) as c:
            for obj in c.list():
                if obj["state"] == "committed":
                    c.delete(obj["key"])

    def pins(self, key):
        """Pins the daemon counts on key (a request of its own: queued
        releases go first)."""
        return sum(o["pins"] for o in self.c.list(prefix=key) if o["key"] == key)

    # A plain object round-trips; its payload is frames, the stream alone.
    def test_plain_object(self):
        value = {"a": [1, 2.5, "three"], "b": (None, True), "c": b"bytes" * 100}
        off = shmbroker.dumps_into(self.c, "plain", value)
        self.assertEqual(shmbroker.loads_from(self.c, "plain"), value)
        self.assertEqual(shmbroker.loads_from(self.c, "plain", copy=False), value)
        with self.c.get_frames("plain") as pin:
            self.assertEqual(pin.offset, off)
            self.assertEqual(len(pin.frames), 1)
            self.assertEqual(pickle.loads(pin.frames[0]), value)
        self.assertEqual(self.pins("plain"), 0)

    # Out-of-band buffers become frames 1..n, in the segment as they were in
    # the object; pickle_frames does not copy them.
    def test_out_of_band_frames(self):
        bufs = [bytearray(b"x" * 1000), bytearray(range(256)), bytearray(b"")]
        value = [pickle.PickleBuffer(b) for b in bufs]
        parts = pickling.pickle_frames(value)
        self.assertEqual(len(parts), 4)
        self.assertIs(parts[1].obj, bufs[0])  # a view of the object's own memory
        shmbroker.dumps_into(self.c, "oob", value)
        stored = self.c.read_frames("oob")
        self.assertEqual(stored[1:], [bytes(b) for b in bufs])
        got = shmbroker.loads_from(self.c, "oob")
        self.assertEqual([bytes(g) for g in got], [bytes(b) for b in bufs])

    # Below protocol 5 everything is in the stream: one frame.
    def test_protocol_4(self):
        shmbroker.dumps_into(self.c, "p5", Blob(b"abc"))
        self.assertEqual(len(self.c.read_frames("p5")), 2)
        shmbroker.dumps_into(self.c, "p4", Blob(b"abc"), protocol=4)
        self.assertEqual(len(self.c.read_frames("p4")), 1)
        self.assertEqual(bytes(shmbroker.loads_from(self.c, "p4").data), b"abc")

    # readers and the client's errors pass through dumps_into.
    def test_readers_and_errors(self):
        shmbroker.dumps_into(self.c, "r", 1, readers=3)
        self.assertEqual(self.c.list(prefix="r")[0]["readers"], 3)
        with self.assertRaises(shmbroker.KeyExists):
            shmbroker.dumps_into(self.c, "r", 2)
        with self.assertRaises(shmbroker.ObjectTooLarge):
            shmbroker.dumps_into(self.c, "huge", b"x" * (self.c.info["max_object_size"] + 1))
        self.assertFalse(self.c.contains("huge"))
        with self.assertRaises(shmbroker.NotFound):
            shmbroker.loads_from(self.c, "absent")

    # A payload that is not frames is refused, and its pin released.
    def test_not_frames(self):
        self.c.put("raw", b"not a frames payload at all")
        with self.assertRaises(shmbroker.ProtocolError):
            shmbroker.loads_from(self.c, "raw")
        with self.assertRaises(shmbroker.ProtocolError):
            shmbroker.loads_from(self.c, "raw", copy=False)
        self.assertEqual(self.pins("raw"), 0)

    # copy=True releases the pin before returning; the object owns its memory.
    def test_copy_releases_at_once(self):
        value = [pickle.PickleBuffer(bytearray(b"y" * 4096))]
        shmbroker.dumps_into(self.c, "copy", value)
        got = shmbroker.loads_from(self.c, "copy")
        self.assertEqual(self.pins("copy"), 0)
        self.assertIsInstance(got[0], bytearray)
        self.assertEqual(bytes(got[0]), b"y" * 4096)

    # copy=False keeps the pin while the object lives and drops it once the
    # object is garbage-collected (and the client makes its next call).
    def test_zero_copy_pin_goes_with_the_object(self):
        shmbroker.dumps_into(self.c, "zc", [pickle.PickleBuffer(bytearray(b"z" * 4096))])
        got = shmbroker.loads_from(self.c, "zc", copy=False)
        self.assertEqual(self.pins("zc"), 1)
        view = memoryview(got[0])
        self.assertTrue(view.readonly)
        self.assertEqual(bytes(view[:3]), b"zzz")
        del got
        gc.collect()
        self.assertEqual(self.pins("zc"), 1)  # the memoryview still uses the bytes
        del view
        gc.collect()
        self.assertEqual(self.pins("zc"), 0)

    # An object kept across a reconnect: its pin went with the old
    # connection, and its release must not take the new connection's pin.
    def test_zero_copy_across_reconnect(self):
        shmbroker.dumps_into(self.c, "zr", [pickle.PickleBuffer(bytearray(b"r" * 4096))])
        got = shmbroker.loads_from(self.c, "zr", copy=False)
        self.c.reconnect()
        self.assertEqual(self.pins("zr"), 0)
        pin = self.c.get("zr")
        del got
        gc.collect()
        self.assertEqual(self.pins("zr"), 1)  # the new pin stays
        pin.release()
        self.assertEqual(self.pins("zr"), 0)

    # The pin of an object of several buffers goes with the last of them.
    def test_zero_copy_several_buffers(self):
        shmbroker.dumps_into(self.c, "zc2", [pickle.PickleBuffer(bytearray(b"a" * 100)),
                                             pickle.PickleBuffer(bytearray(b"b" * 100))])
        first, second = shmbroker.loads_from(self.c, "zc2", copy=False)
        del first
        gc.collect()
        self.assertEqual(self.pins("zc2"), 1)
        del second
        gc.collect()
        self.assertEqual(self.pins("zc2"), 0)

    # Without out-of-band buffers nothing points into the segment: released at once.
    def test_zero_copy_without_buffers(self):
        shmbroker.dumps_into(self.c, "nobuf", {"x": 1})
        self.assertEqual(shmbroker.loads_from(self.c, "nobuf", copy=False), {"x": 1})
        self.assertEqual(self.pins("nobuf"), 0)


@unittest.skipIf(np is None, "numpy is not installed (Debian: python3-numpy)")
class NumpyPicklingTest(PicklingTest):
    """Arrays: zero-copy views of the segment, and the pin's lifetime
    following every array derived from them."""

    # Arrays round-trip; copy=True gives writable arrays of their own.
    def test_arrays_copy(self):
        value = {"a": np.arange(100000, dtype=np.float64), "b": np.eye(3, dtype=np.int8),
                 "f": np.asfortranarray(np.arange(12).reshape(3, 4))}
        shmbroker.dumps_into(self.c, "arrays", value)
        self.assertEqual(len(self.c.read_frames("arrays")), 4)
        got = shmbroker.loads_from(self.c, "arrays")
        for k in value:
            np.testing.assert_array_equal(got[k], value[k])
            self.assertTrue(got[k].flags.writeable)
        self.assertTrue(got["f"].flags.f_contiguous)
        self.assertEqual(self.pins("arrays"), 0)

    # copy=False: the array is a read-only view of the segment (it shares
    # memory with the object's pinned frame) and 64-aligned.
    def test_arrays_zero_copy(self):
        a = np.arange(100000, dtype=np.float64)
        shmbroker.dumps_into(self.c, "zarr", a)
        got = shmbroker.loads_from(self.c, "zarr", copy=False)
        np.testing.assert_array_equal(got, a)
        self.assertFalse(got.flags.writeable)
        self.assertEqual(got.ctypes.data % 64, 0)
        with self.c.get_frames("zarr") as pin:
            self.assertTrue(np.shares_memory(got, np.frombuffer(pin.frames[1], np.float64)))
        del got

    # The pin stays while anything derived from the array lives: a slice, a
    # memoryview of it; it goes with the last of them.
    def test_pin_follows_derived_arrays(self):
        shmbroker.dumps_into(self.c, "derived", np.arange(1000, dtype=np.int32))
        got = shmbroker.loads_from(self.c, "derived", copy=False)
        part = got[10:20]
        mv = memoryview(got)[5:]
        del got
        gc.collect()
        self.assertEqual(self.pins("derived"), 1)
        del part
        gc.collect()
        self.assertEqual(self.pins("derived"), 1)
        self.assertEqual(mv[0], 5)
        del mv
        gc.collect()
        self.assertEqual(self.pins("derived"), 0)


if __name__ == "__main__":
    unittest.main()
