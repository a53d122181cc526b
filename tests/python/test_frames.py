# SPDX-License-Identifier: Apache-2.0
"""The frames layout (several buffers in one payload): the header's bytes,
readers refusing anything else, zero, one and many frames, and every frame
64-aligned in memory."""

import ctypes
import struct
import unittest

import support
import shmbroker
from shmbroker import frames


class TestLayout(unittest.TestCase):
    def test_layout_numbers(self):
        self.assertEqual(frames.layout([]), (64, [], 64))
        self.assertEqual(frames.layout([5]), (64, [64], 69))
        self.assertEqual(frames.layout([5, 0, 3]), (64, [64, 128, 128], 131))
        self.assertEqual(frames.layout([1] * 7), (128, [128 + 64 * i for i in range(7)], 513))
        self.assertEqual(frames.layout([0] * 6)[0], 64)
        self.assertEqual(frames.layout([0] * 7)[0], 128)
        with self.assertRaises(ValueError):
            frames.layout([0] * 65536)

    def test_header_bytes(self):
        """Little-endian magic "MHSBFRM1", count, flags 0, lengths, zeros."""
        buf = bytearray(b"\xaa" * 200)
        frames.write_header(buf, [3, 70])
        self.assertEqual(bytes(buf[:8]), b"MHSBFRM1")
        self.assertEqual(struct.unpack_from("<QIIQQ", buf), (0x314D52464253484D, 2, 0, 3, 70))
        self.assertEqual(bytes(buf[32:64]), bytes(32))
        self.assertEqual(bytes(buf[64:]), b"\xaa" * 136)  # frames are not its business

    def good(self, lengths):
        header, offsets, total = frames.layout(lengths)
        buf = bytearray(total)
        frames.write_header(buf, lengths)
        for i, (o, n) in enumerate(zip(offsets, lengths)):
            buf[o:o + n] = bytes([i + 1]) * n
        return buf

    def test_parse_round_trip(self):
        for lengths in ([], [0], [1], [64], [65, 0, 7], [1000] * 10):
            got = frames.parse(self.good(lengths))
            self.assertEqual([len(f) for f in got], lengths)
            for i, f in enumerate(got):
                self.assertTrue(f.readonly)
                self.assertEqual(bytes(f), bytes([i + 1]) * lengths[i])

    def test_bad_headers_refused(self):
        ok = self.good([10, 20])
        bad = {
            "short": bytes(ok[:15]),
            "magic": b"X" + bytes(ok[1:]),
            "flags": ok[:12] + b"\x01\0\0\0" + ok[16:],
            "count too big": ok[:8] + struct.pack("<I", 65536) + ok[12:],
            "header beyond payload": ok[:8] + struct.pack("<I", 9) + ok[12:],
            "size too large": ok + b"\0",
            "size too small": ok[:-1],
            "length beyond": ok[:16] + struct.pack("<Q", 1 << 40) + ok[24:],
        }
        for why, data in bad.items():
            with self.assertRaises(shmbroker.ProtocolError, msg=why) as cm:
                frames.parse(data)
            self.assertEqual(cm.exception.code, "EPROTO")
            self.assertTrue(str(cm.exception).startswith("Not a frames payload"), why)
            self.assertFalse(frames.is_frames(data))
        self.assertTrue(frames.is_frames(ok))


class TestFramesThroughDaemon(support.DaemonTest):
    def test_zero_one_many(self):
        cases = {"zero": [], "one": [b"only"], "empty": [b""],
                 "many": [b"a" * n for n in (1, 0, 63, 64, 65, 1000)]}
        for key, bufs in cases.items():
            self.c.put(key, bufs)
            self.assertEqual(self.c.read_frames(key), bufs)
            with self.c.get_frames(key) as pin:
                self.assertEqual(len(pin.view), frames.layout([len(b) for b in bufs])[2])
                self.assertEqual([bytes(f) for f in pin.frames], bufs)

    def test_frames_aligned_in_memory(self):
        """Every frame is a view of the mapping at a multiple of 64 from a
        page-aligned base: aligned in the process's memory."""
        bufs = [b"x" * n for n in (3, 100, 0, 64, 129)]
        self.c.put("al", bufs)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.c._mmap))
        self.assertEqual(base % 4096, 0)
        with self.c.get_frames("al") as pin:
            _, offsets, _ = frames.layout([len(b) for b in bufs])
            for f, o in zip(pin.frames, offsets):
                at = pin.offset + o
                self.assertEqual((base + at) % 64, 0)
                if len(f):
                    # The frame aliases the mapping there: a byte written
                    # through the mapping shows in the frame (a test only;
                    # committed objects are never written).
                    self.c._mv[at] = ord("Q")
                    self.assertEqual(f[0], ord("Q"))
                    self.c._mv[at] = ord("x")

    def test_not_frames_refused_and_released(self):
        self.c.put("plain", b"not frames at all")
        with self.assertRaises(shmbroker.ProtocolError):
            self.c.get_frames("plain")
        self.assertEqual(self.c.stats()["pinned"], 0)
        with self.c.get("plain") as pin:
            with self.assertRaises(shmbroker.ProtocolError):
                pin.frames
        with self.assertRaises(shmbroker.ProtocolError):
            self.c.read_frames("plain")
        self.assertEqual(self.c.stats()["pinned"], 0)

    def test_put_many_frames(self):
        res = self.c.put_many([("f1", [b"a", b"b"]), ("f2", b"plain")])
        self.assertTrue(all(isinstance(r, int) for r in res))
        self.assertEqual(self.c.read_frames("f1"), [b"a", b"b"])
        self.assertEqual(self.c.read("f2"), b"plain")
