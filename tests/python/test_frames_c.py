# SPDX-License-Identifier: Apache-2.0
"""Frames across languages: an object put by Python is read by the C library
(build/tests/shmb-frames-tool, over shmb_get_frames), and one put by C is
read by Python, byte for byte, so that both sides implement one layout."""

import hashlib
import os
import subprocess
import tempfile

import support
import shmbroker


def frames_tool():
    """The C tool: $SHMB_BUILD_DIR/tests/shmb-frames-tool, else the source
    tree's build/ (make test builds it)."""
    build = os.environ.get("SHMB_BUILD_DIR") or os.path.join(support.ROOT, "build")
    return os.path.join(os.path.abspath(build), "tests", "shmb-frames-tool")


# Frames of awkward lengths: empty, one byte, one under, at and over 64, and
# one larger than a page; each filled with bytes that differ per frame.
LENGTHS = [0, 1, 63, 64, 65, 5000]


def payloads():
    return [bytes((i * 37 + j) & 0xFF for j in range(n)) for i, n in enumerate(LENGTHS)]


class TestFramesAcrossLanguages(support.DaemonTest):
    def tool(self, *args):
        return subprocess.run([frames_tool(), self.d.socket_path] + list(args),
                              capture_output=True, text=True, timeout=30)

    def test_tool_is_built(self):
        self.assertTrue(os.access(frames_tool(), os.X_OK),
                        "%s is missing: make test builds it" % frames_tool())

    def test_python_put_c_get(self):
        data = payloads()
        self.c.put("py-frames", data)
        out = self.tool("get", "py-frames")
        self.assertEqual(out.returncode, 0, out.stderr)
        want = ["%d %s" % (len(d), hashlib.sha256(d).hexdigest()) for d in data]
        self.assertEqual(out.stdout.splitlines(), want)
        self.assertEqual(self.c.list()[0]["pins"], 0)  # the tool released its pin

    def test_c_put_python_get(self):
        data = payloads()
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for i, d in enumerate(data):
                path = os.path.join(tmp, "f%d" % i)
                with open(path, "wb") as f:
                    f.write(d)
                files.append(path)
            out = self.tool("put", "c-frames", *files)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(self.c.read_frames("c-frames"), data)
        with self.c.get_frames("c-frames") as pin:
            self.assertEqual([len(v) for v in pin.frames], LENGTHS)

    def test_c_refuses_what_is_not_frames(self):
        self.c.put("plain", b"not a frames payload, just bytes" * 4)
        out = self.tool("get", "plain")
        self.assertEqual(out.returncode, 1)
        self.assertIn("frames", out.stderr)
        with self.assertRaises(shmbroker.ProtocolError):
            self.c.read_frames("plain")
        self.assertEqual(self.c.list()[0]["pins"], 0)
