# SPDX-License-Identifier: Apache-2.0
"""Client.fetch and 'shmbrokerctl fetch' against a stand-in relay on the
daemon's socket path + ".relay": what each answer of the relay becomes
(tests/relay/test_relay.py drives real relays between two namespaces)."""

import json
import os
import socket
import subprocess
import threading
import unittest

import support
import shmbroker
from shmbroker import errors


class StandInRelay:
    """Answers each connection's one request line with the next of answers
    (bytes, sent as they are; None: close without answering)."""

    def __init__(self, test, path, answers):
        self.answers = list(answers)
        self.requests = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        self.path = path
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        test.addCleanup(self.close)

    def serve(self):
        for answer in self.answers:
            conn, _ = self.sock.accept()
            with conn:
                f = conn.makefile("rb")
                self.requests.append(json.loads(f.readline()))
                if answer is not None:
                    conn.sendall(answer)

    def close(self):
        self.sock.close()
        self.thread.join(5)
        if os.path.exists(self.path):
            os.unlink(self.path)


def ctl():
    return os.environ.get("SHMBROKERCTL", os.path.join(
        os.path.dirname(support.daemon_binary()), "shmbrokerctl"))


class TestFetch(support.DaemonTest):
    def relay(self, *answers):
        return StandInRelay(self, self.d.socket_path + ".relay", answers)

    def test_no_relay_is_connection_lost_naming_the_socket(self):
        with self.assertRaises(errors.ConnectionLost) as cm:
            self.c.fetch("node2", "k")
        self.assertEqual(cm.exception.code, "ENOTCONN")
        self.assertIn(self.d.socket_path + ".relay", str(cm.exception))
        self.assertIn("start shmbroker-relay", str(cm.exception))

    def test_bad_peer_name_and_key_are_refused_before_asking(self):
        r = self.relay()
        for peer in ("", "a b", "x" * 65, "n\u00e9", None):
            with self.assertRaises(errors.InvalidRequest):
                self.c.fetch(peer, "k")
        with self.assertRaises(errors.InvalidRequest):
            self.c.fetch("node2", "k\x00")
        self.assertEqual(r.requests, [])

    def test_answers_become_results_and_errors(self):
        r = self.relay(b'{"ok":true,"peer":"node2","key":"k","size":4096}\n',
                       b'{"ok":false,"error":"ENOENT","message":"No object \'k\'."}\n',
                       b'{"ok":false,"error":"ECONNRESET","message":"cut"}\n',
                       b'not json\n', None)
        self.assertEqual(self.c.fetch("node2", "k"), 4096)
        self.assertEqual(r.requests[0], {"op": "fetch", "peer": "node2", "key": "k"})
        with self.assertRaises(errors.NotFound) as cm:
            self.c.fetch("node2", "k")
        self.assertEqual(str(cm.exception), "No object 'k'.")
        with self.assertRaises(errors.ConnectionLost):
            self.c.fetch("node2", "k")
        with self.assertRaises(errors.ProtocolError):
            self.c.fetch("node2", "k")
        with self.assertRaises(errors.ConnectionLost) as cm:
            self.c.fetch("node2", "k")
        self.assertIn("closed the connection before it answered", str(cm.exception))

    def test_ctl_fetch_goes_through_the_library(self):
        r = self.relay(b'{"ok":true,"peer":"node2","key":"k","size":1}\n',
                       b'{"ok":false,"error":"ENOENT","message":"No object \'k2\' there."}\n')
        ok = subprocess.run([ctl(), "--socket", self.d.socket_path, "fetch", "node2", "k"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=30)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        bad = subprocess.run([ctl(), "--socket", self.d.socket_path, "fetch", "node2", "k2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=30)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("No object 'k2' there.", bad.stderr)
        self.assertEqual([q["key"] for q in r.requests], ["k", "k2"])

    def test_ctl_fetch_without_a_relay_says_so(self):
        out = subprocess.run([ctl(), "--socket", self.d.socket_path, "fetch", "node2", "k"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn("ENOTCONN: No relay answers at " + self.d.socket_path + ".relay",
                      out.stderr)
        self.assertNotIn("lost the connection to shmbrokerd", out.stderr)

    def test_ctl_status_without_a_relay_shows_no_relay(self):
        out = subprocess.run([ctl(), "--socket", self.d.socket_path, "status"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertNotIn("Relay", out.stdout)


if __name__ == "__main__":
    unittest.main()
