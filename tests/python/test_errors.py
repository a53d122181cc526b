# SPDX-License-Identifier: Apache-2.0
"""Every error class, raised by a real daemon where a client can cause it:
its code, the daemon's message as str(e), and the built-in it also is."""

import os
import pickle
import threading
import time
import unittest

import support
import shmbroker
from shmbroker import errors


class TestErrorsFromDaemon(support.DaemonTest):
    def check(self, e, cls, builtin, code, message_start):
        self.assertIs(type(e), cls)
        if builtin is not None:
            self.assertIsInstance(e, builtin)
        self.assertIsInstance(e, shmbroker.ShmBrokerError)
        self.assertEqual(e.code, code)
        self.assertEqual(str(e), e.message)
        self.assertTrue(e.message.startswith(message_start), e.message)

    def fill(self):
        """Pin an object of half the segment and put another: full."""
        self.c.put("big1", b"x" * 500000)
        pin = self.c.get("big1")
        self.c.put("big2", b"y" * 500000)
        return pin

    def test_enospc_is_memory_error(self):
        pin = self.fill()
        with self.assertRaises(MemoryError) as cm:
            self.c.put("more", b"z" * 100000)
        self.check(cm.exception, shmbroker.NoSpace, MemoryError, "ENOSPC",
                   "No space for 'more' (100000 bytes)")
        self.assertIn("'big1' blocks reclaim (pins=1", str(cm.exception))
        pin.release()

    def test_etimedout_is_timeout_error(self):
        pin = self.fill()
        with self.assertRaises(TimeoutError) as cm:
            self.c.put("more", b"z" * 100000, wait_ms=20)
        self.check(cm.exception, shmbroker.Timeout, TimeoutError, "ETIMEDOUT",
                   "Waited 20 ms for space. No space for 'more'")
        pin.release()

    def test_e2big_is_value_error(self):
        with self.assertRaises(ValueError) as cm:
            self.c.alloc("huge", 524289)
        self.check(cm.exception, shmbroker.ObjectTooLarge, ValueError, "E2BIG",
                   "Object size (524289 bytes) exceeds max object size (524288 bytes)")

    def test_eexist_is_value_error(self):
        self.c.put("k", b"1")
        with self.assertRaises(ValueError) as cm:
            self.c.put("k", b"2")
        self.check(cm.exception, shmbroker.KeyExists, ValueError, "EEXIST",
                   "Key 'k' already exists in the storage.")

    def test_einval_is_value_error(self):
        self.c.put("k", b"1")
        with self.assertRaises(ValueError) as cm:
            self.c.touch("k", 2000000)
        self.check(cm.exception, shmbroker.InvalidRequest, ValueError, "EINVAL", "")
        with self.assertRaises(shmbroker.InvalidRequest) as cm:
            self.c.alloc("k2", 0)
        self.check(cm.exception, shmbroker.InvalidRequest, ValueError, "EINVAL",
                   "\"size\" must be between 1 and")

    def test_enoent_is_lookup_error(self):
        with self.assertRaises(LookupError) as cm:
            self.c.get("absent")
        self.check(cm.exception, shmbroker.NotFound, LookupError, "ENOENT",
                   "No object 'absent'; check the key")
        with self.assertRaises(KeyError.__base__):
            self.c.release("absent")

    def test_eperm_is_permission_error(self):
        ro = self.d.client(read_only=True)
        self.addCleanup(ro.close)
        for call in (lambda: ro.put("k", b"1"), lambda: ro.alloc("k", 1),
                     lambda: ro.touch("k", 1), lambda: ro.delete("k")):
            with self.assertRaises(PermissionError) as cm:
                call()
            self.check(cm.exception, shmbroker.PermissionDenied, PermissionError, "EPERM",
                       "This connection is read-only")

    def test_enosys_and_eproto_from_raw_requests(self):
        r = self.c.request({"op": "frobnicate"})
        e = shmbroker.error_for(r["error"], r["message"])
        self.check(e, shmbroker.Unsupported, NotImplementedError, "ENOSYS", "Unknown op")
        r = self.c.request({"op": "hello", "version": 2})
        e = shmbroker.error_for(r["error"], r["message"])
        self.check(e, shmbroker.ProtocolError, None, "EPROTO", "Unsupported protocol version 2")

    def test_emsgsize_refused_before_sending(self):
        with self.assertRaises(shmbroker.ProtocolError) as cm:
            self.c.request({"op": "list", "prefix": "p" * 70000})
        self.assertEqual(cm.exception.code, "EMSGSIZE")
        self.assertTrue(self.c.contains("x") is False)  # the connection is intact

    def test_connection_lost_when_daemon_stops(self):
        self.d.stop()
        with self.assertRaises(ConnectionError) as cm:
            self.c.stats()
        self.check(cm.exception, shmbroker.ConnectionLost, ConnectionError, "ECONNRESET",
                   "Connection to shmbrokerd lost")
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            self.c.stats()
        self.assertEqual(cm.exception.code, "ENOTCONN")

    def test_daemon_dies_mid_call(self):
        """A call waiting in the daemon (an alloc with wait_ms) when the
        daemon is killed raises ConnectionLost, not a hang or a crash."""
        pin = self.fill()
        killer = threading.Thread(target=self._kill_when_waiting)
        killer.start()
        with self.assertRaises(shmbroker.ConnectionLost):
            self.c.put("more", b"z" * 100000, wait_ms=60000)
        killer.join()
        self.assertTrue(pin.view.readonly)
        pin.release()  # the pin went with the connection: nothing is sent

    def _kill_when_waiting(self):
        # Whether the kill lands while the alloc waits in the daemon or just
        # before it is sent, the call must end in ConnectionLost.
        while not self.c._busy.locked():
            pass
        self.d.kill()


class TestQuota(support.DaemonTest):
    DAEMON_ARGS = ("--max-pins", "1")

    def test_edquot(self):
        self.c.put("k", b"1")
        pin = self.c.get("k")
        with self.assertRaises(shmbroker.QuotaExceeded) as cm:
            self.c.get("k")
        e = cm.exception
        self.assertEqual(e.code, "EDQUOT")
        self.assertTrue(str(e).startswith("max-pins (1) reached"), str(e))
        pin.release()


class TestAdmission(support.DaemonTest):
    DAEMON_ARGS = ("--max-clients", "2")

    def test_refusal_at_connect_is_its_own_error(self):
        """The daemon writes its refusal and closes, often before the hello
        arrives: the refusal still answers the hello (QuotaExceeded with the
        daemon's words), not a lost connection. 50 tries."""
        while self.c.stats()["clients"] > 1:  # the start-up probe's close, not yet seen
            time.sleep(0.01)
        other = self.d.client()
        self.addCleanup(other.close)
        for _ in range(50):
            with self.assertRaises(shmbroker.QuotaExceeded) as cm:
                shmbroker.Client(self.d.socket_path)
            self.assertTrue(str(cm.exception).startswith("max-clients (2) reached"),
                            str(cm.exception))


class TestNoDaemon(unittest.TestCase):
    def test_not_running_says_how_to_start(self):
        path = os.path.join(support.shm_base(), "none.sock")
        with self.assertRaises(ConnectionError) as cm:
            shmbroker.Client(path)
        e = cm.exception
        self.assertIsInstance(e, shmbroker.ConnectionLost)
        self.assertEqual(e.code, "ENOENT")
        self.assertIn(path, str(e))
        for how in ("make run", "systemctl start shmbrokerd", "shmbrokerd --socket " + path):
            self.assertIn(how, str(e))
        os.rmdir(os.path.dirname(path))

    def test_classes_and_bases(self):
        """error_for gives each code its class; unknown codes a plain one;
        exceptions pickle (to cross process boundaries)."""
        table = {"ENOSPC": MemoryError, "E2BIG": ValueError, "EEXIST": ValueError,
                 "EINVAL": ValueError, "ENOENT": LookupError, "ETIMEDOUT": TimeoutError,
                 "EPERM": PermissionError, "ENOSYS": NotImplementedError,
                 "ECONNREFUSED": ConnectionError, "ECONNRESET": ConnectionError,
                 "ENOTCONN": ConnectionError}
        for code, base in table.items():
            e = shmbroker.error_for(code, "msg " + code)
            self.assertIsInstance(e, base)
            self.assertEqual((e.code, e.message, str(e)), (code, "msg " + code, "msg " + code))
            back = pickle.loads(pickle.dumps(e))
            self.assertIs(type(back), type(e))
            self.assertEqual((back.code, back.message), (e.code, e.message))
        for code in ("EPROTO", "EMSGSIZE"):
            self.assertIs(type(shmbroker.error_for(code, "m")), shmbroker.ProtocolError)
        self.assertIs(type(shmbroker.error_for("EDQUOT", "m")), shmbroker.QuotaExceeded)
        for code in ("EIO", "ENOMEM", "EMFILE", "ENEWCODE"):
            self.assertIs(type(shmbroker.error_for(code, "m")), shmbroker.ShmBrokerError)
        self.assertEqual(set(errors.__all__) - set(shmbroker.__all__), set())
