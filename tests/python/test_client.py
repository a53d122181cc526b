# SPDX-License-Identifier: Apache-2.0
"""Every Client method against a real daemon, the id matching against a fake
one, read-only clients, keys refused before sending, killed readers, daemon
restarts, big batches, and use after release or close."""

import array
import gc
import json
import os
import pickle
import signal
import socket
import threading
import unittest
import warnings

import support
import shmbroker
from shmbroker import _protocol as P


def wait_until(cond, what, tries=2000):
    """Poll cond (which asks the daemon, a round trip each) until it holds."""
    for _ in range(tries):
        if cond():
            return
        threading.Event().wait(0.005)
    raise AssertionError("never happened: " + what)


class TestClientOps(support.DaemonTest):
    def test_info_and_defaults(self):
        info = self.c.info
        self.assertEqual(info["size"], 1048576)
        self.assertEqual(info["data_offset"], 4096)
        self.assertEqual(info["mode"], "rw")
        self.assertEqual(info["alignment"], 64)
        self.assertNotIn("ok", info)
        self.assertFalse(self.c.closed)
        self.assertEqual(self.c.socket_path, self.d.socket_path)
        old = os.environ.get("SHMBROKER_SOCKET")
        try:
            os.environ["SHMBROKER_SOCKET"] = self.d.socket_path
            with shmbroker.Client() as c2:
                self.assertEqual(c2.socket_path, self.d.socket_path)
            del os.environ["SHMBROKER_SOCKET"]
            self.assertEqual(shmbroker.default_socket_path(), "/run/shmbroker/shmbroker.sock")
        finally:
            if old is not None:
                os.environ["SHMBROKER_SOCKET"] = old
        mine = [x for x in self.c.clients() if x["self"]]
        self.assertEqual(mine[0]["name"], "test")

    def test_put_buffers_and_read(self):
        """put takes any buffer; the offset is the payload's, aligned."""
        for key, data in (("b", b"bytes"), ("ba", bytearray(b"ba")), ("mv", memoryview(b"mv")),
                          ("arr", array.array("i", [1, 2, 3])),
                          ("nc", memoryview(b"abcdef")[::2])):
            off = self.c.put(key, data)
            self.assertEqual(off % 64, 0)
            expect = bytes(data) if not isinstance(data, memoryview) else data.tobytes()
            self.assertEqual(self.c.read(key), expect)
            with self.c.get(key) as pin:
                self.assertEqual(pin.offset, off)
                self.assertEqual(self.c.object_header(off)[1], key)

    def test_get_pins_until_release(self):
        self.c.put("k", b"payload")
        pin = self.c.get("k")
        self.assertTrue(pin.view.readonly)
        self.assertEqual(bytes(pin.view), b"payload")
        self.assertEqual(len(pin), 7)
        self.assertEqual(self.c.list()[0]["pins"], 1)
        with self.assertRaises(TypeError):
            pin.view[0] = 1
        pin.release()
        pin.release()  # twice is nothing
        self.assertEqual(self.c.list()[0]["pins"], 0)
        with self.assertRaises(ValueError):
            bytes(pin.view)  # released with the pin
        with self.c.get("k") as p2:
            self.assertEqual(self.stats()["pinned"], 1)
        self.assertTrue(p2.released)
        self.assertEqual(self.stats()["pinned"], 0)

    def test_alloc_commit_and_abort(self):
        with self.c.alloc("w", 4) as a:
            self.assertFalse(a.view.readonly)
            self.assertEqual(len(a.view), 4)
            a.view[:] = b"abcd"
            self.assertFalse(self.c.contains("w"))
        self.assertEqual(self.c.read("w"), b"abcd")
        with self.assertRaises(RuntimeError):
            with self.c.alloc("x", 8) as a:
                raise RuntimeError("writer failed")
        self.assertFalse(self.c.contains("x"))
        self.assertEqual(self.stats()["pending"], 0)
        a = self.c.alloc("x", 8)  # the key is free again
        a.abort()
        a.abort()
        a = self.c.alloc("y", 8, readers=2)
        a.commit()
        with self.assertRaises(shmbroker.InvalidRequest):
            a.commit()
        self.assertEqual(self.c.list(prefix="y")[0]["readers"], 2)

    # put() aborts its allocation when the copy into it raises (an error or
    # an interrupt), so no object and no pending allocation stay, the key
    # is free again and the copy's exception is the one raised.
    def test_put_aborts_when_the_copy_fails(self):
        import shmbroker.client as client_module
        real = client_module._write

        def failing(view, part):
            view[:4] = b"half"
            raise self.failure

        client_module._write = failing
        try:
            for self.failure in (OSError(5, "copy failed"), KeyboardInterrupt()):
                with self.assertRaises(type(self.failure)):
                    self.c.put("torn", b"whole payload")
                self.assertFalse(self.c.contains("torn"))
                self.assertEqual(self.stats()["pending"], 0)
        finally:
            client_module._write = real
        self.c.put("torn", b"whole payload")
        self.assertEqual(self.c.read("torn"), b"whole payload")

    def test_touch_delete_contains_list(self):
        self.c.put("t", b"1")
        self.c.touch("t", 3)
        self.assertEqual(self.c.list("t")[0]["readers"], 3)
        self.c.touch("t", 1, noreply=True)
        self.assertEqual(self.c.list("t")[0]["readers"], 4)
        self.assertTrue("t" in self.c)
        self.c.delete("t")
        self.assertFalse(self.c.contains("t"))
        self.c.put("t", b"2")
        self.c.delete("t", noreply=True)
        self.assertFalse("t" in self.c)
        for i in range(5):
            self.c.put("l%d" % i, b"x")
        objs = self.c.list("l", limit=3)
        self.assertIsInstance(objs, shmbroker.ObjectList)
        self.assertEqual([o["key"] for o in objs], ["l0", "l1", "l2"])
        self.assertTrue(objs.truncated)
        self.assertFalse(self.c.list("l").truncated)
        self.assertEqual(set(objs[0]), {"key", "offset", "size", "pins", "readers", "state",
                                        "age_ms"})

    def test_stats_and_clients(self):
        s = self.c.stats()
        self.assertEqual(list(s)[:len(P.STATS_FIELDS)], list(P.STATS_FIELDS))
        self.assertEqual(tuple(s["counters"]), P.STATS_COUNTERS)
        self.assertEqual(s["used"] + s["free"], s["data_size"])
        with self.d.client(name="second", read_only=True):
            names = {(x["name"], x["mode"]) for x in self.c.clients()}
            self.assertIn(("second", "ro"), names)

    def test_dropped_pin_warns_and_stays(self):
        """A Pin garbage-collected unreleased gives a ResourceWarning and
        keeps its pin (released by key, as the C library's)."""
        self.c.put("d", b"1")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            self.c.get("d")
            gc.collect()
        self.assertTrue(any(issubclass(w.category, ResourceWarning) and "release('d')"
                            in str(w.message) for w in seen))
        self.assertEqual(self.c.list()[0]["pins"], 1)
        self.c.release("d")
        self.assertEqual(self.c.list()[0]["pins"], 0)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with self.c.get("d"):
                pass
            gc.collect()
        self.assertEqual([w for w in seen if issubclass(w.category, ResourceWarning)], [])

    def test_release_noreply_and_later(self):
        self.c.put("r", b"1")
        self.c.get("r")
        self.c.get("r")
        self.c.release("r", noreply=True)
        self.assertEqual(self.c.list()[0]["pins"], 1)
        self.c.release_later("r")
        self.assertEqual(self.c._later and len(self.c._later), 1)  # nothing sent yet
        self.assertEqual(self.c.list()[0]["pins"], 0)  # sent before this request
        self.assertEqual(self.stats()["counters"]["noreply_errors"], 0)

    def test_request_raw(self):
        r = self.c.request({"op": "contains", "key": "nope"})
        self.assertEqual(r["ok"], True)
        self.assertEqual(r["exists"], False)
        self.assertIsInstance(r["id"], int)
        r = self.c.request({"op": "get", "key": "nope", "id": "mine"})
        self.assertEqual((r["ok"], r["error"], r["id"]), (False, "ENOENT", "mine"))
        self.assertIsNone(self.c.request({"op": "release", "key": "nope", "noreply": True}))
        self.assertEqual(self.c.stats()["counters"]["noreply_errors"], 1)

    def test_object_header(self):
        key = "k" * 200  # a header longer than one 64-byte line
        off = self.c.put(key, b"v")
        chunk_id, got = self.c.object_header(off)
        self.assertEqual(got, key)
        self.assertEqual(chunk_id, 0)
        off2 = self.c.put("é", b"v")
        self.assertEqual(self.c.object_header(off2), (1, "é"))
        for bad in (off + 1, 0, self.c.info["size"] + 64, off2 + 64):
            with self.assertRaises(shmbroker.ProtocolError):
                self.c.object_header(bad)

    def test_wait_ms_gets_room_when_released(self):
        self.c.put("big1", b"x" * 500000)
        other = self.d.client()
        self.addCleanup(other.close)
        pin = other.get("big1")
        self.c.put("big2", b"y" * 500000)
        t = threading.Thread(target=lambda: (wait_until(lambda: self.c._busy.locked(), "wait"),
                                             pin.release()))
        t.start()
        off = self.c.put("more", b"z" * 100000, wait_ms=30000)
        t.join()
        self.assertEqual(self.c.read("more"), b"z" * 100000)
        self.assertGreater(off, 0)

    def test_one_client_per_thread(self):
        """A call while another thread's call runs is refused, not mixed."""
        self.c.put("big1", b"x" * 500000)
        pin = self.c.get("big1")
        self.c.put("big2", b"y" * 500000)
        errs = []
        t = threading.Thread(target=lambda: errs.append(
            self.assertRaises(shmbroker.Timeout, self.c.put, "m", b"z" * 100000, wait_ms=300)))
        t.start()
        wait_until(lambda: self.c._busy.locked(), "the call to start")
        with self.assertRaises(shmbroker.ShmBrokerError) as cm:
            self.c.stats()
        self.assertEqual(cm.exception.code, "EBUSY")
        t.join()
        pin.release()
        self.assertEqual(self.c.stats()["pinned"], 0)

    def test_interrupted_call_drops_the_connection(self):
        """An exception (KeyboardInterrupt) between a request and its reply
        drops the connection, so that the reply cannot meet a later call."""
        def interrupt(*args):
            raise KeyboardInterrupt
        real = self.c._read_line
        self.c._read_line = interrupt
        try:
            with self.assertRaises(KeyboardInterrupt):
                self.c.stats()
        finally:
            del self.c._read_line
        self.assertIs(self.c._read_line.__func__, real.__func__)
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            self.c.stats()
        self.assertEqual(cm.exception.code, "ENOTCONN")
        self.c.reconnect()
        self.assertFalse(self.c.contains("x"))

    def test_fork_child_refused(self):
        pid = os.fork()
        if pid == 0:
            try:
                self.c.stats()
                os._exit(1)
            except shmbroker.ShmBrokerError as e:
                os._exit(0 if e.code == "ECHILD" else 2)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual(self.c.stats()["clients"], 1)


class TestKeys(support.DaemonTest):
    def test_keys_refused_before_sending(self):
        """Bad keys get the daemon's words, and nothing reaches it."""
        before = self.c._last_id
        long_key = "k" * 256
        daemon = self.c.request({"op": "get", "key": long_key})
        before = self.c._last_id
        with self.assertRaises(shmbroker.InvalidRequest) as cm:
            self.c.get(long_key)
        self.assertEqual(str(cm.exception), daemon["message"])
        cases = {
            "": "Key of 0 bytes: keys are 1 to 255 bytes long.",
            "é" * 128: "Key of 256 bytes: keys are 1 to 255 bytes long.",
            "a\0b": "Key contains a NUL byte at offset 1; keys are UTF-8 text of 1 to 255 "
                    "bytes without NUL.",
            b"ab\xff": "Key is not valid UTF-8 (byte 0xff at offset 2); keys are UTF-8 text "
                       "of 1 to 255 bytes.",
            "ab\udcff": "Key is not valid UTF-8 (byte 0xff at offset 2); keys are UTF-8 text "
                        "of 1 to 255 bytes.",
            "\ud800": "Key is not valid UTF-8 (byte 0xed at offset 0); keys are UTF-8 text "
                      "of 1 to 255 bytes.",
        }
        for key, message in cases.items():
            for call in (self.c.get, self.c.read, self.c.contains, self.c.delete,
                         lambda k: self.c.put(k, b"x"), lambda k: self.c.touch(k, 1),
                         self.c.release, self.c.release_later):
                with self.assertRaises(shmbroker.InvalidRequest) as cm:
                    call(key)
                self.assertEqual(cm.exception.code, "EINVAL")
                self.assertEqual(str(cm.exception), message)
        with self.assertRaises(shmbroker.InvalidRequest) as cm:
            self.c.get_many(["ok", b"\xc3"])
        self.assertTrue(str(cm.exception).startswith("keys[1] of 2: Key is not valid UTF-8"))
        with self.assertRaises(TypeError):
            self.c.get(42)
        self.assertEqual(self.c._last_id, before)
        self.assertEqual(self.c.stats()["counters"]["gets"], 0)  # the daemon's refusal too
        self.assertEqual(shmbroker.check_key("ключ".encode()), "ключ")
        self.c.put("ключ", b"1")
        self.assertEqual(self.c.read(b"\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87"), b"1")


class TestCareless(support.DaemonTest):
    def test_careless_arguments(self):
        """Wrong types and texts are refused before sending; the connection
        stays usable."""
        with self.assertRaises(TypeError):
            self.c.alloc("k", 1.5)
        with self.assertRaises(TypeError):
            self.c.put("k", "a str is not bytes")
        with self.assertRaises(TypeError):
            self.c.put("k", [b"ok", 42])
        with self.assertRaises(shmbroker.InvalidRequest):
            self.c.list(prefix=b"\xff")
        with self.assertRaises(shmbroker.InvalidRequest):
            self.c.list(prefix="\udcff")
        with self.assertRaises(shmbroker.InvalidRequest):
            shmbroker.Client(self.d.socket_path, name="\udcff")
        with self.assertRaises(shmbroker.InvalidRequest):
            self.c.put("k", b"")  # the daemon's: size 0
        for bad in (float("nan"), float("inf")):
            with self.assertRaises(shmbroker.InvalidRequest):
                self.c.request({"op": "touch", "key": "k", "readers": bad})
        self.assertFalse(self.c.contains("k"))
        self.assertEqual(self.c.stats()["pending"], 0)
        self.assertEqual(self.c.put("k", b"1"), self.c.list()[0]["offset"])


class TestStaleAndOdd(support.DaemonTest):
    """What a careless caller does after a reconnect, and values the daemon
    cannot parse: refused here, the connection kept."""

    def test_stale_allocation_after_reconnect(self):
        """An Allocation of a connection since reset cannot commit another's
        allocation of the same key, nor write through its view."""
        a1 = self.c.alloc("k", 8)
        self.c.reconnect()
        a2 = self.c.alloc("k", 8)
        with self.assertRaises(ValueError):
            a1.view[:] = b"CLOBBER!"
        with self.assertRaises(shmbroker.ConnectionLost):
            a1.commit()
        self.assertEqual(self.stats()["pending"], 1)  # nothing was sent
        a2.view[:] = b"mine...."
        a2.commit()
        self.assertEqual(self.c.read("k"), b"mine....")

    def test_values_beyond_the_protocol_refused_before_sending(self):
        """Integers beyond 64 bits and NUL in text would get a reply without
        an id, resetting the connection and its pins: refused here."""
        self.c.put("k", b"v")
        pin = self.c.get("k")
        calls = [lambda: self.c.alloc("big", 1 << 64),
                 lambda: self.c.list(prefix="a\0b"),
                 lambda: self.c.touch("k", 1 << 64, noreply=True),
                 lambda: self.c.request({"op": "stats", "id": 1 << 64}),
                 lambda: self.c.put("w", b"x", wait_ms=1 << 64)]
        for call in calls:
            with self.assertRaises(shmbroker.InvalidRequest):
                call()
        self.assertEqual(self.c.list()[0]["pins"], 1)  # the connection and its pin stayed
        pin.release()

    def test_request_noreply_on_an_op_that_answers(self):
        """noreply on an op that does not take it is answered by the daemon;
        request() reads that answer, so the next call is in step."""
        r = self.c.request({"op": "stats", "noreply": True})
        self.assertEqual((r["ok"], r["error"]), (False, "EINVAL"))
        r = self.c.request({"op": "contains", "key": "k", "id": None})
        self.assertIsNone(r["id"])  # the caller's own id, null included
        self.assertFalse(self.c.contains("k"))

    def test_refused_before_sending_can_be_retried(self):
        """A commit refused by this client before anything was sent (another
        thread's call running) may be made again."""
        a = self.c.alloc("k", 1)
        a.view[0] = 7
        self.c._busy.acquire()  # as another thread's call would hold it
        try:
            with self.assertRaises(shmbroker.ShmBrokerError) as cm:
                a.commit()
            self.assertEqual(cm.exception.code, "EBUSY")
        finally:
            self.c._busy.release()
        a.commit()
        self.assertEqual(self.c.read("k"), b"\x07")

    def test_odd_arguments(self):
        with self.assertRaises(TypeError):
            self.c.put_many([("k", b"v")], readers=1.5)
        with self.assertRaises(TypeError):
            self.c.get_many("key")
        with self.assertRaises(TypeError):
            self.c.release_many("key")
        with self.assertRaises(shmbroker.InvalidRequest):
            self.c.put("\udcc3\udca9", b"v")  # lone surrogates spelling "\u00e9"
        self.assertEqual(self.c.list(), [])
        err = shmbroker.ConnectionLost("ENOENT", "no socket")
        back = pickle.loads(pickle.dumps(err))
        self.assertIs(type(back), shmbroker.ConnectionLost)
        self.assertEqual((back.code, back.message), ("ENOENT", "no socket"))


class TestReadOnly(support.DaemonTest):
    def test_read_only_client(self):
        self.c.put("k", b"data")
        ro = self.d.client(read_only=True)
        self.addCleanup(ro.close)
        self.assertEqual(ro.info["mode"], "ro")
        self.assertTrue(ro._mv.readonly)
        with self.assertRaises(TypeError):
            ro._mmap[4096] = 1
        with ro.get("k") as pin:
            self.assertEqual(bytes(pin.view), b"data")
        self.assertEqual(ro.read("k"), b"data")
        self.assertTrue(ro.contains("k"))
        for call in (lambda: ro.put("n", b"1"), lambda: ro.delete("k"),
                     lambda: ro.touch("k", 1), lambda: ro.alloc("n", 1)):
            with self.assertRaises(shmbroker.PermissionDenied):
                call()
        res = ro.put_many([("a", b"1")])
        self.assertIsInstance(res[0], shmbroker.PermissionDenied)
        self.assertTrue(self.c.contains("k"))


class TestMany(support.DaemonTest):
    DAEMON_SIZE = "8M"

    def test_put_get_many_5000(self):
        """5000 keys over several batch lines, with per-key errors."""
        self.c.put("k17", b"taken")
        items = [("k%d" % i, b"v%d" % i) for i in range(5000)]
        items[40] = ("k40", [b"a", b"bb"])
        res = self.c.put_many(items)
        self.assertEqual(len(res), 5000)
        self.assertIsInstance(res[17], shmbroker.KeyExists)
        self.assertEqual(res[17].code, "EEXIST")
        self.assertTrue(all(isinstance(r, int) for i, r in enumerate(res) if i != 17))
        self.assertEqual(self.c.stats()["objects"], 5000)
        self.assertGreaterEqual(self.c.stats()["counters"]["allocs"], 5000)
        keys = [k for k, _ in items] + ["missing"]
        pins = self.c.get_many(keys)
        self.assertIsInstance(pins[-1], shmbroker.NotFound)
        self.assertEqual(bytes(pins[17].view), b"taken")
        self.assertEqual(bytes(pins[4999].view), b"v4999")
        self.assertEqual([bytes(f) for f in pins[40].frames], [b"a", b"bb"])
        self.assertEqual(self.c.stats()["pinned"], 5000)
        self.c.release_many(keys[:-1])
        self.assertEqual(self.c.stats()["pinned"], 0)
        self.assertEqual(self.c.stats()["counters"]["noreply_errors"], 0)

    def test_put_many_long_keys_split_by_bytes(self):
        """Lines are cut at 64 KiB: 600 keys of 250 bytes is more than one."""
        items = [(("%03d" % i) * 84)[:250] for i in range(600)]
        res = self.c.put_many([(k, b"x") for k in items])
        self.assertTrue(all(isinstance(r, int) for r in res))
        pins = self.c.get_many(items)
        self.assertTrue(all(isinstance(p, shmbroker.Pin) for p in pins))
        self.c.release_many(items)
        self.assertEqual(self.c.stats()["pinned"], 0)


class TestListPastScan(support.DaemonTest):
    DAEMON_SIZE = "32M"

    def test_list_goes_on_past_the_daemons_scan(self):
        """The daemon looks at 65,536 objects per list request and says where
        to go on: list() asks again from there, so a prefix only the newest
        of 70,000 keys has is still found, and limit still holds."""
        res = self.c.put_many([("s%06d" % i, b"x") for i in range(70000)])
        self.assertTrue(all(isinstance(r, int) for r in res))
        self.c.put("zlast", b"x")
        self.c.put("s069999b", b"x")
        objs = self.c.list("zlast")
        self.assertEqual([o["key"] for o in objs], ["zlast"])
        self.assertFalse(objs.truncated)
        objs = self.c.list("s06999", limit=5)
        self.assertEqual([o["key"] for o in objs],
                         ["s069990", "s069991", "s069992", "s069993", "s069994"])
        self.assertTrue(objs.truncated)
        objs = self.c.list("s069999")
        self.assertEqual([o["key"] for o in objs], ["s069999", "s069999b"])
        self.assertFalse(objs.truncated)


class TestManyCapped(support.DaemonTest):
    DAEMON_SIZE = "4M"
    DAEMON_ARGS = ("--max-pending", "100")

    def test_put_many_under_max_pending(self):
        res = self.c.put_many([("p%d" % i, b"x") for i in range(1500)])
        self.assertTrue(all(isinstance(r, int) for r in res), [r for r in res if not
                                                               isinstance(r, int)][:1])
        self.assertEqual(self.c.stats()["objects"], 1500)


class TestLifecycle(support.DaemonTest):
    def test_killed_reader_releases_its_pins(self):
        """A Python reader killed with SIGKILL holding pins: the daemon
        releases them, and the space can be reclaimed."""
        self.c.put("k", b"x" * 1000)
        child = support.child_python(
            "import sys, shmbroker\n"
            "c = shmbroker.Client(sys.argv[1], name='reader')\n"
            "p = c.get('k'); q = c.get('k')\n"
            "print(len(p.view), flush=True)\n"
            "sys.stdin.read()\n", self.d.socket_path)
        self.assertEqual(child.stdout.readline().strip(), b"1000")
        self.assertEqual(self.c.list()[0]["pins"], 2)
        self.assertEqual(self.c.stats()["pinned"], 1)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stderr.close()
        child.stdin.close()
        wait_until(lambda: self.c.stats()["pinned"] == 0, "pins released")
        self.assertEqual(self.c.list()[0]["pins"], 0)
        self.c.delete("k")
        self.assertEqual(self.c.stats()["used"], 0)

    def test_reconnect_after_daemon_restart(self):
        """SIGKILL the daemon, start it again with the same name and size: it
        adopts the segment, reconnect() keeps the mapping, the old object
        reads back at the same offset."""
        off = self.c.put("kept", b"survives")
        pin = self.c.get("kept")
        old_view = pin.view
        old_map = self.c._mmap
        self.d.kill()
        self.d.start()
        with self.assertRaises(shmbroker.ConnectionLost):
            self.c.stats()
        self.c.reconnect()
        self.assertIs(self.c._mmap, old_map)
        self.assertEqual(bytes(old_view), b"survives")
        pin.release()  # its connection is gone: nothing is sent
        with self.c.get("kept") as p2:
            self.assertEqual(p2.offset, off)
            self.assertEqual(bytes(p2.view), b"survives")
            self.assertEqual(self.c.stats()["pinned"], 1)
        self.assertEqual(self.c.stats()["pinned"], 0)

    def test_reconnect_to_another_segment_remaps(self):
        self.c.put("a", b"1")
        old_map = self.c._mmap
        self.d.stop()
        self.d.start()  # a clean stop removed the file: a new segment
        self.c.reconnect()
        self.assertIsNot(self.c._mmap, old_map)
        self.assertFalse(self.c.contains("a"))
        self.c.put("a", b"2")
        self.assertEqual(self.c.read("a"), b"2")

    def test_release_while_view_exported(self):
        """A pin released while something holds a buffer export of its view
        (a PickleBuffer here; numpy takes its own view): no crash, the
        daemon's pin goes, the bytes stay readable through the export."""
        self.c.put("k", b"exported")
        pin = self.c.get("k")
        held = pickle.PickleBuffer(pin.view)
        pin.release()
        self.assertTrue(pin.released)
        self.assertEqual(self.c.stats()["pinned"], 0)
        self.assertEqual(bytes(held.raw()), b"exported")
        held.release()

    def test_close_with_exported_views(self):
        """close() while views are exported: nothing crashes, the bytes stay
        readable, the pins are gone, later calls raise ConnectionLost."""
        self.c.put("k", b"still here")
        pin = self.c.get("k")
        alloc = self.c.alloc("w", 4)
        view = pin.view
        other = self.d.client()
        self.addCleanup(other.close)
        self.c.close()
        self.c.close()
        self.assertTrue(self.c.closed)
        self.assertEqual(bytes(view), b"still here")
        pin.release()
        with self.assertRaises(ValueError):
            alloc.view[:] = b"late"  # the allocation went with the connection, its view too
        alloc.abort()
        wait_until(lambda: other.stats()["pinned"] == 0 and other.stats()["pending"] == 0,
                   "the closed client's pins and allocations go")
        for call in (self.c.stats, lambda: self.c.get("k"), self.c.reconnect):
            with self.assertRaises(shmbroker.ConnectionLost) as cm:
                call()
            self.assertEqual(cm.exception.code, "ENOTCONN")
        with self.assertRaises(ValueError):
            pin.frames


class FakeDaemon(support.FakeServer):
    """A server that answers hello with a descriptor of a real (fake)
    segment, then replies as the test says: for out-of-step replies."""

    def __init__(self, test, replies, extra_fds=0, magic=P.SEGMENT_MAGIC, split=False,
                 data_size=4096):
        super().__init__(test)
        self.seg = os.path.join(self.dir, "seg")
        with open(self.seg, "wb") as f:
            head = P.SEGMENT_HEADER.pack(magic, P.LAYOUT_VERSION, 4096, 8192, 4096, data_size,
                                         *[0] * (len(P.SEGMENT_HEADER_FIELDS) - 6))
            f.write(head + bytes(8192 - len(head)))
        self.replies = replies
        self.extra_fds = extra_fds
        self.split = split
        self.start()

    def serve(self):
        conn, _ = self.listener.accept()
        with conn:
            f = conn.makefile("rb")
            hello = json.loads(f.readline())
            self.seen.append(hello)
            reply = (json.dumps({"ok": True, "version": 1, "segment": "fake", "size": 8192,
                                 "data_offset": 4096, "data_size": 4096,
                                 "max_object_size": 4096, "alignment": 64, "mode": "rw",
                                 "id": hello["id"]}) + "\n").encode()
            fds = [os.open(self.seg, os.O_RDWR)] + [os.open(os.devnull, os.O_RDONLY)
                                                     for _ in range(self.extra_fds)]
            if self.split:
                socket.send_fds(conn, [reply[:10]], fds)
                conn.sendall(reply[10:])
            else:
                socket.send_fds(conn, [reply], fds)
            for fd in fds:
                os.close(fd)
            for make in self.replies:
                line = f.readline()
                if not line:
                    return
                req = json.loads(line)
                self.seen.append(req)
                out = make(req)
                if out is not None:
                    conn.sendall(out.encode() + b"\n")
            f.read()


def devnull_fds():
    """Descriptors of this process open on /dev/null."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink("/proc/self/fd/" + fd) == os.devnull
        except OSError:
            pass
    return n


class TestIds(unittest.TestCase):
    def connect(self, replies, **kw):
        fake = FakeDaemon(self, replies, **kw)
        c = shmbroker.Client(fake.path)
        self.addCleanup(c.close)
        return fake, c

    def test_ids_on_every_request(self):
        """Each request, noreply included, carries a new integer id."""
        fake, c = self.connect([lambda r: None, lambda r: '{"ok":true,"exists":false,"id":%d}'
                                % r["id"]])
        c.release("k", noreply=True)
        self.assertFalse(c.contains("k"))
        ids = [r["id"] for r in fake.seen]
        self.assertEqual(ids, [1, 2, 3])
        self.assertTrue(fake.seen[1]["noreply"])

    def test_pin_release_awaits_no_reply(self):
        """read() and leaving a Pin's with send a noreply release: one round
        trip per read, the get's."""
        def get(r):
            return '{"ok":true,"offset":4096,"size":8,"id":%d}' % r["id"]

        fake, c = self.connect([get, lambda r: None, get, lambda r: None,
                                lambda r: '{"ok":true,"exists":false,"id":%d}' % r["id"]])
        c._sock.settimeout(5)  # a release awaiting a reply fails, rather than hangs
        self.assertEqual(len(c.read("k")), 8)
        with c.get("k") as pin:
            self.assertEqual(pin.size, 8)
        self.assertFalse(c.contains("k"))  # answered: no release waited for a reply
        ops = [(r["op"], r.get("noreply")) for r in fake.seen[1:]]
        self.assertEqual(ops, [("get", None), ("release", True), ("get", None),
                               ("release", True), ("contains", None)])

    def test_wrong_id_resets(self):
        fake, c = self.connect([lambda r: '{"ok":true,"exists":true,"id":%d}' % (r["id"] + 1)])
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            c.contains("k")
        self.assertEqual(cm.exception.code, "ECONNRESET")
        self.assertIn("Reply out of step with its request: expected id 2, got id 3",
                      str(cm.exception))
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            c.contains("k")
        self.assertEqual(cm.exception.code, "ENOTCONN")

    def test_reply_without_id_or_with_another_type(self):
        for bad in ('{"ok":false,"error":"EPROTO","message":"x"}', '{"ok":true,"id":"2"}',
                    '{"ok":true,"id":true}', 'not json', '[1]'):
            fake, c = self.connect([lambda r, bad=bad: bad])
            with self.assertRaises(shmbroker.ConnectionLost, msg=bad):
                c.stats()

    def test_deeply_nested_reply_resets(self):
        """A reply nested deeper than Python's json can decode (a
        RecursionError, not a ValueError) resets the connection as any reply
        that cannot be read, rather than raising an exception a caller of
        this package does not expect."""
        deep = '{"ok":true,"x":%s%s,"id":2}' % ("[" * 100000, "]" * 100000)
        fake, c = self.connect([lambda r: deep])
        with self.assertRaises(shmbroker.ConnectionLost) as cm:
            c.stats()
        self.assertEqual(cm.exception.code, "ECONNRESET")

    def test_reports_without_their_list(self):
        """queue_list, clients and list replies that lack their list (or carry
        another type) raise ProtocolError, not KeyError or TypeError."""
        for call, bad in ((lambda c: c.queue_list(), '{"ok":true,"id":%d}'),
                          (lambda c: c.queue_list(seats=True), '{"ok":true,"queues":5,"id":%d}'),
                          (lambda c: c.clients(), '{"ok":true,"clients":{},"id":%d}'),
                          (lambda c: c.list(), '{"ok":true,"objects":7,"id":%d}')):
            fake, c = self.connect([lambda r, bad=bad: bad % r["id"]])
            with self.assertRaises(shmbroker.ProtocolError, msg=bad) as cm:
                call(c)
            self.assertEqual(cm.exception.code, "EPROTO")

    def test_reply_to_a_noreply_line_is_out_of_step(self):
        """A noreply release answered anyway (the daemon could not parse it):
        the next call sees that answer and resets instead of taking it."""
        fake, c = self.connect([
            lambda r: '{"ok":false,"error":"EPROTO","message":"Invalid JSON"}',
            lambda r: '{"ok":true,"offset":4160,"size":8,"id":%d}' % r["id"]])
        c.release_later("k")
        with self.assertRaises(shmbroker.ConnectionLost):
            c.get("other")

    def test_offset_outside_data_area(self):
        fake, c = self.connect([
            lambda r: '{"ok":true,"offset":8192,"size":64,"id":%d}' % r["id"],
            lambda r: None])
        with self.assertRaises(shmbroker.ProtocolError) as cm:
            c.get("k")
        self.assertIn("outside the data area", str(cm.exception))
        c.close()
        fake.thread.join(5)
        self.assertEqual(fake.seen[-1]["op"], "release")

    def test_extra_descriptors_closed_and_split_hello(self):
        before = devnull_fds()
        fake, c = self.connect([lambda r: '{"ok":true,"exists":false,"id":%d}' % r["id"]],
                               extra_fds=3, split=True)
        self.assertFalse(c.contains("x"))
        self.assertEqual(devnull_fds(), before)  # the extra three were closed
        self.assertEqual(c.info["segment"], "fake")

    def test_bad_segment_magic(self):
        fake = FakeDaemon(self, [], magic=0x1234)
        with self.assertRaises(shmbroker.ProtocolError) as cm:
            shmbroker.Client(fake.path)
        self.assertIn("not a shmbroker segment", str(cm.exception))

    def test_header_disagrees_with_hello(self):
        fake = FakeDaemon(self, [], data_size=2048)
        with self.assertRaises(shmbroker.ProtocolError) as cm:
            shmbroker.Client(fake.path)
        self.assertIn("hello said 4096, 4096 bytes", str(cm.exception))
