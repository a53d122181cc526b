# SPDX-License-Identifier: Apache-2.0
"""The vLLM store's hot path without waited round trips: a put goes through
the writer's arena with its commit not waited for, a get reads the chunk in
place checked by its seal, is_cached looks at the mapping. Counted here:
the replies each process waited for, and the daemon's gets. And what must
not change: a scribbled chunk header or an object deleted under the read
gives vLLM's ValueError, never other bytes; awaited reads reach zero so the
object can be evicted; a commit the daemon refused is forgotten by the
writer, whose next put is made."""

import json
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import unittest
import uuid
from unittest import mock

import support  # noqa: F401  (puts the package on the path)
import shmbroker
from shmbroker import _protocol as P
from shmbroker import client as client_mod
from shmbroker import frames as _frames
from shmbroker import pickling
from shmbroker import vllm
from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer

from test_arena import count_round_trips

MiB = 1024 * 1024


def wait_until(pred, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for %s" % what)
        time.sleep(0.005)


class MappedPathTest(unittest.TestCase):
    def make_store(self, buffer_size=16 * MiB, n_readers=1, **kw):
        ring = SingleWriterShmRingBuffer(buffer_size, name="shmb-test-%s" % uuid.uuid4().hex[:12],
                                         create=True)
        store = ShmBrokerObjectStorage(max_object_size=4 * MiB, n_readers=n_readers,
                                       ring_buffer=ring, **kw)
        self.addCleanup(store.close)
        return store

    def reader_of(self, store, serde_class=None):
        handle = store.handle()
        if serde_class is not None:
            handle.serde_class = serde_class
        reader = ShmBrokerObjectStorage.create_from_handle(handle)
        self.addCleanup(reader.close)
        return reader

    # After the first put (which takes an arena and publishes the base),
    # puts and gets of committed objects wait for no reply at all, and the
    # daemon pins nothing for the readers: they read in place.
    def test_no_round_trip(self):
        store = self.make_store()
        reader = self.reader_of(store)
        pair = store.put("first", b"0" * 4096)
        self.assertEqual(reader.get(*pair), b"0" * 4096)
        writer_trips = count_round_trips(store.ring_buffer.client)
        reader_trips = count_round_trips(reader.ring_buffer.client)
        gets = store.ring_buffer.client.stats()["counters"]["gets"]
        del writer_trips[:]
        for i in range(40):
            value = os.urandom(4096 + i)
            pair = store.put("k%d" % i, value)
            # The commit landed (the daemon may be slow to run on a loaded
            # machine; a get that finds none asks it, which is not counted
            # here: test_commit_landing_late).
            wait_until(lambda: reader._mapped(reader._abs(*pair)[0]) is not None,
                       "the commit of k%d in the mapping" % i)
            self.assertEqual(reader.get(*pair), value)
            self.assertTrue(store.is_cached("k%d" % i))
        self.assertEqual(writer_trips, [])
        self.assertEqual(reader_trips, [])
        self.assertEqual(store.ring_buffer.client.stats()["counters"]["gets"], gets)

    # Each get counts the read the object awaits, in place: once every
    # reader read it, it awaits none and may be evicted.
    def test_awaited_reads_reach_zero(self):
        store = self.make_store(n_readers=2)
        readers = [self.reader_of(store), self.reader_of(store)]
        client = store.ring_buffer.client
        pair = store.put("k", {"a": 1})
        store.ring_buffer.client.sync()
        self.assertEqual(client.list("k")[0]["readers"], 2)
        readers[0].get(*pair)
        wait_until(lambda: client.list("k")[0]["readers"] == 1, "the first read counted")
        readers[1].get(*pair)
        wait_until(lambda: client.list("k")[0]["readers"] == 0, "the second read counted")

    # A reader counts the reads it awaits in the chunk's seal (its mapping
    # is read-write): its gets send the daemon nothing at all, not even a
    # request it does not wait for, and the object still awaits no read
    # once both readers got it.
    def test_reader_counts_in_the_seal(self):
        store = self.make_store(n_readers=2)
        readers = [self.reader_of(store), self.reader_of(store)]
        client = store.ring_buffer.client
        store.put("warm", b"w")
        for reader in readers:
            self.assertFalse(reader.ring_buffer.client.read_only)
        sent = []
        for reader in readers:
            rc = reader.ring_buffer.client
            rc._send = lambda data, _real=rc._send: (sent.append(data), _real(data))[1]
        pairs = [store.put("k%d" % i, os.urandom(1000 + i)) for i in range(20)]
        client.sync()
        for reader in readers:
            for pair in pairs:
                reader.get(*pair)
        self.assertEqual(sent, [])
        wait_until(lambda: all(o["readers"] == 0 for o in client.list("k")),
                   "every awaited read counted")

    # A read-only reader (read_only=True, or SHMBROKER_VLLM_READ_ONLY=1 for
    # readers made from a handle) cannot write the seal: it counts each read
    # by a request it does not wait for, and the counts reach zero as well.
    def test_read_only_reader_counts_by_request(self):
        store = self.make_store(n_readers=1)
        ring = SingleWriterShmRingBuffer(*store.ring_buffer.handle(), read_only=True)
        reader = ShmBrokerObjectStorage(4 * MiB, 1, ring)
        self.addCleanup(reader.close)
        old = os.environ.get("SHMBROKER_VLLM_READ_ONLY")
        os.environ["SHMBROKER_VLLM_READ_ONLY"] = "1"
        try:
            from_env = self.reader_of(store)
        finally:
            if old is None:
                del os.environ["SHMBROKER_VLLM_READ_ONLY"]
            else:
                os.environ["SHMBROKER_VLLM_READ_ONLY"] = old
        self.assertTrue(ring.client.read_only)
        self.assertTrue(from_env.ring_buffer.client.read_only)
        client = store.ring_buffer.client
        for i, who in enumerate((reader, from_env)):
            lines = []
            rc = who.ring_buffer.client
            rc._send = lambda data, _real=rc._send: (lines.append(data), _real(data))[1]
            pair = store.put("r%d" % i, b"x" * 5000)
            self.assertEqual(who.get(*pair), b"x" * 5000)
            self.assertTrue(any(b'"op":"read"' in line for line in lines))
            wait_until(lambda: client.list("r%d" % i)[0]["readers"] == 0, "the read counted")
        with self.assertRaises(shmbroker.ShmBrokerError):
            reader.ring_buffer.client.put("nope", b"x")
        # A writer cannot be read-only: said at once, nothing started.
        with self.assertRaises(ValueError):
            SingleWriterShmRingBuffer(MiB, create=True, read_only=True)

    # bytes and bytearrays of 1 KiB and more go out of band: the serde hands
    # the value itself to the put (copied once, into the segment), the
    # payload's second frame is the bytes, and a get gives back the same
    # type and bytes; small ones and other values stay in the stream.
    def test_bytes_out_of_band(self):
        store = self.make_store()
        reader = self.reader_of(store)
        serde = vllm.PickleSerde()
        for value in (os.urandom(64 * 1024), bytearray(os.urandom(5000)), b"x" * 1024):
            pieces = serde.serialize(value)[0]
            self.assertIs(pieces[-1], value)
            pair = store.put("b%d" % len(value), value)
            store.ring_buffer.client.sync()
            offset, _chunk_id = store._objects["b%d" % len(value)]
            found = store._mapped(offset)
            frames = shmbroker.frames.parse(store.ring_buffer.client._mv[offset:offset + found[3]])
            self.assertEqual(len(frames), 2)
            self.assertEqual(bytes(frames[1]), bytes(value))
            got = reader.get(*pair)
            self.assertIs(type(got), type(value))
            self.assertEqual(got, value)
        for value in (b"x" * 1023, bytes(0), {"k": b"y" * 4096}):
            self.assertEqual(reader.get(*store.put("s%d" % len(value), value)), value)

    # The base the pairs count from is read from the catalog once, then
    # known by its chunk's seal: neither a get nor a put reads it again
    # (read_stats() counts no read); a base replaced (clear()) is read again, so that
    # pairs counted from the new one resolve.
    def test_base_known_by_its_seal(self):
        store = self.make_store()
        reader = self.reader_of(store)
        for key in ("first", "second"):  # the base set, then read back
            self.assertEqual(reader.get(*store.put(key, "v")), "v")

        def reads():
            return [sum(st.ring_buffer.client.read_stats().values()) for st in (store, reader)]
        before = reads()
        for i in range(20):
            pair = store.put("k%d" % i, i)
            self.assertEqual(reader.get(*pair), i)
        self.assertEqual(reads(), before)
        store.clear()
        pair = store.put("again", "new base")
        self.assertEqual(pair, (0, 0))
        self.assertEqual(reader.get(*pair), "new base")
        self.assertGreater(reads()[1], before[1])

    # A scribbled chunk header (magic, chunk id, state) makes the get raise
    # vLLM's ValueError; never does it return bytes of another object.
    def test_scribbled_header(self):
        store = self.make_store()
        reader = self.reader_of(store)
        mv = store.ring_buffer.client._mv
        for i, (field, at, size) in enumerate((("magic", 0, 4), ("state", 4, 2),
                                               ("id", 16, 8), ("header_size", 8, 4))):
            pair = store.put("s%d" % i, "value %d" % i)
            store.ring_buffer.client.sync()
            offset = store._objects["s%d" % i][0]
            chunk = offset - P.align64(P.CHUNK_HEADER_SIZE + len("s%d" % i))
            mv[chunk + at:chunk + at + size] = b"\x55" * size
            with self.assertRaises(ValueError, msg=field) as cm:
                reader.get(*pair)
            self.assertIn("has been modified or is invalid", str(cm.exception))

    # An object deleted while a reader deserializes it in place (its seal's
    # generation goes to 0): the read is not trusted; the get asks the
    # daemon, which no longer has it: vLLM's ValueError.
    def test_deleted_under_the_read(self):
        store = self.make_store()
        deleter = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(deleter.close)

        class DeletingSerde(vllm.PickleSerde):
            def deserialize(self, data):
                value = super().deserialize(data)
                deleter.delete("d")
                return value

        reader = self.reader_of(store, DeletingSerde)
        pair = store.put("d", "doomed")
        with self.assertRaises(ValueError):
            reader.get(*pair)

    # A commit the daemon refused (another client committed the key after
    # the writer looked): the writer forgets the object when the refusal
    # is reported, and its next put is made.
    def test_refused_commit_forgotten(self):
        store = self.make_store()
        client = store.ring_buffer.client
        other = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(other.close)
        other.put("k", b"theirs")
        store.put("a", "older")  # alive: pruning stops at it
        client._listed = lambda key: False  # the look missed it
        store.put("k", "mine")  # sent without waiting; refused
        del client._listed
        client.contains("anything")  # a reply: the refusal is told
        pair = store.put("next", "value")
        self.assertNotIn("k", store.key_index)
        self.assertFalse(store.is_cached("k"))
        self.assertEqual(self.reader_of(store).get(*pair), "value")
        self.assertEqual(other.read("k"), b"theirs")

    # A put made while the daemon was stopped (published in the writer's
    # arena, no request since), then the daemon killed: the restarted daemon
    # folds it when it adopts the segment, so that it is not lost with the
    # daemon: the writer still has it, a reader's get of its pair reads it,
    # and the writer's next put is made.
    def test_published_put_outlives_the_daemon(self):
        tmp = tempfile.mkdtemp(prefix="shmb-lost-")
        self.addCleanup(shutil.rmtree, tmp, True)
        sock = os.path.join(tmp, "d.sock")
        name = "shmb-lost-%s" % uuid.uuid4().hex[:8]
        d = shmbroker.spawn_daemon(4 * MiB, socket_path=sock, name=name)
        self.addCleanup(lambda: d.stop())
        ring = SingleWriterShmRingBuffer(4 * MiB, create=True, socket_path=sock)
        store = ShmBrokerObjectStorage(MiB, 1, ring)
        self.addCleanup(store.close)
        reader = self.reader_of(store)
        kept = store.put("kept", "committed")
        store.ring_buffer.client.sync()
        os.kill(d.pid, signal.SIGSTOP)
        lost = store.put("lost", "published")
        os.kill(d.pid, signal.SIGKILL)
        d._proc.wait()
        d = shmbroker.spawn_daemon(4 * MiB, socket_path=sock, name=name)
        after = store.put("after", "new")
        self.assertIn("lost", store.key_index)
        self.assertTrue(store.is_cached("lost"))
        self.assertEqual(reader.get(*lost), "published")
        self.assertEqual(reader.get(*kept), "committed")
        self.assertEqual(reader.get(*after), "new")
        self.assertTrue(store.ring_buffer.client.contains("lost"))

    # Puts and gets while the daemon is stopped (SIGSTOP): the writer
    # publishes each chunk in its arena and the reader reads it from the
    # mapping, neither waiting for the daemon (a put that waited for a
    # commit's reply, or a get that waited for a commit to land and then
    # asked the daemon, would hang here). The daemon, let go on, folds them
    # into objects every client sees, with the reads counted meanwhile.
    def test_pairs_read_while_the_daemon_is_stopped(self):
        store = self.make_store()
        reader = self.reader_of(store)
        store.put("first", "so that the base is set")
        store.ring_buffer.client.sync()
        reader.get(*store.key_index["first"])
        pid = store.ring_buffer.daemon.pid  # the store's private daemon
        done = []

        def work():
            pairs = [store.put("stopped %d" % i, "value %d" % i) for i in range(3)]
            done.extend(reader.get(*p) for p in pairs)

        os.kill(pid, signal.SIGSTOP)
        try:
            t = threading.Thread(target=work, daemon=True)
            t.start()
            t.join(20)
        finally:
            os.kill(pid, signal.SIGCONT)
        self.assertEqual(done, ["value 0", "value 1", "value 2"])
        other = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(other.close)
        for i in range(3):
            self.assertTrue(other.contains("stopped %d" % i))
            # The reader's one awaited read was counted before the fold.
            self.assertEqual(other.list("stopped %d" % i)[0]["readers"], 0)

    # A key that is not UTF-8 text, too long, empty or not a str is refused
    # with the client's InvalidRequest (a ValueError) or TypeError before
    # anything is written; the next put goes on through the arena.
    def test_bad_keys(self):
        store = self.make_store()
        reader = self.reader_of(store)
        for key in ("\udcff", "x" * 256, "", "nul\0"):
            with self.assertRaises(shmbroker.InvalidRequest, msg=repr(key)):
                store.put(key, "v")
        with self.assertRaises(TypeError):
            store.put(7, "v")
        pair = store.put("good", "v")
        self.assertEqual(reader.get(*pair), "v")
        self.assertEqual(store.ring_buffer.client.stats()["counters"]["noreply_errors"], 0)

    # A key another client holds is found in the catalog: KeyExists at once.
    def test_key_of_another_client(self):
        store = self.make_store()
        other = shmbroker.Client(store.ring_buffer.socket_path)
        self.addCleanup(other.close)
        other.put("k", b"theirs")
        with self.assertRaises(ValueError) as cm:
            store.put("k", "mine")
        self.assertEqual(str(cm.exception), "Key 'k' already exists in the storage.")

    # A get whose commit is not in the mapping yet looks again after a
    # sched_yield() (the daemon about to commit it often waits for this very
    # CPU), not after time.sleep(0), which sleeps for the timer's slack each
    # time (50 us and more): here the first three looks find nothing.
    def test_landing_wait_yields(self):
        store = self.make_store()
        reader = self.reader_of(store)
        pair = store.put("k", b"v" * 4096)
        wait_until(lambda: reader._mapped(reader._abs(*pair)[0]) is not None,
                   "the commit of k in the mapping")
        real = reader._mapped
        looks = []

        def late(*args):
            looks.append(args)
            return None if len(looks) <= 3 else real(*args)

        slept, yielded = [], []

        class Clock:
            monotonic = staticmethod(time.monotonic)

            @staticmethod
            def sleep(seconds):
                slept.append(seconds)
                time.sleep(seconds)

        reader._mapped = late
        # The spin's bound made long, so that a loaded machine's slow looks
        # stay within it: what is tested is how it waits, not how long.
        with mock.patch.object(vllm, "_LANDING_S", 60.0), \
                mock.patch.object(vllm, "time", Clock), \
                mock.patch.object(os, "sched_yield", lambda: yielded.append(1)):
            self.assertEqual(reader.get(*pair), b"v" * 4096)
        self.assertEqual(len(looks), 4)
        self.assertEqual(len(yielded), 3)
        self.assertEqual(slept, [])

    # A get whose commit lands only after the looks of _LANDING_S (here
    # none: a daemon slow to run) asks the daemon once, then reads the
    # object in place: the daemon pins nothing for it.
    def test_landing_after_a_round_trip(self):
        store = self.make_store()
        reader = self.reader_of(store)
        pair = store.put("k", b"w" * 4096)
        wait_until(lambda: reader._mapped(reader._abs(*pair)[0]) is not None,
                   "the commit of k in the mapping")
        gets = store.ring_buffer.client.stats()["counters"]["gets"]
        real = reader._mapped
        looks = []

        def late(*args):
            looks.append(args)
            return None if len(looks) == 1 else real(*args)

        reader._mapped = late
        with mock.patch.object(vllm, "_LANDING_S", 0.0):
            self.assertEqual(reader.get(*pair), b"w" * 4096)
        self.assertEqual(len(looks), 2)
        self.assertEqual(store.ring_buffer.client.stats()["counters"]["gets"], gets)

    # The serde reads back what it made of bytes or a bytearray, or of a
    # value with one out-of-band buffer (a numpy array in a dict, here a
    # PickleBuffer), without the general frames parse, and gives what the
    # general path gives (the same value, or the same error) for those
    # payloads and for each of them altered: magic, count, lengths, stream,
    # size.
    def test_out_of_band_fast_path(self):
        serde = vllm.PickleSerde()

        def general(data):
            parts = _frames.parse(data)
            if len(parts) == 2:
                for cls, stream in vllm._OOB_STREAMS.items():
                    if parts[0] == stream:
                        return cls(parts[1])
            return pickling.unpickle_frames(parts, copy=True)

        def outcome(fn, data):
            try:
                value = fn(memoryview(data).toreadonly())
            except Exception as e:  # noqa: BLE001  (compared by type)
                return type(e)
            return type(value), value

        def altered(payload):
            yield payload
            for at, byte in ((0, 0x00), (8, 0x03), (12, 0x01), (16, 0x07), (24, 0x01),
                             (64, 0x00), (70, 0xFF), (len(payload) - 1, 0x5A)):
                b = bytearray(payload)
                b[at] ^= byte or 0xFF
                yield bytes(b)
            yield payload[:-1]
            yield payload + bytes(64)
            yield payload[:64]

        payloads = []
        for value in (b"x" * 1024, bytes(range(256)) * 20, bytearray(b"y" * 70001),
                      b"short", "text", {"a": [1, 2]}, bytearray(3000)):
            pieces, total, _md, _n = serde.serialize(value)
            payload = b"".join(bytes(p) for p in pieces)
            self.assertEqual(len(payload), total)
            payloads.append(payload)
            self.assertEqual(outcome(serde.deserialize, payload)[1], value)
        # One buffer out of band, read back as its own copy (a bytearray).
        pieces, total, _md, _n = serde.serialize(
            {"buf": pickle.PickleBuffer(bytearray(b"z" * 5000)), "i": 1})
        payloads.append(b"".join(bytes(p) for p in pieces))
        self.assertEqual(len(payloads[-1]), total)
        self.assertEqual(serde.deserialize(memoryview(payloads[-1]).toreadonly()),
                         {"buf": bytearray(b"z" * 5000), "i": 1})
        for payload in payloads:
            for data in altered(payload):
                self.assertEqual(outcome(serde.deserialize, data), outcome(general, data))
        # bytes and a bytearray are read back without the general parse.
        with mock.patch.object(_frames, "parse", side_effect=AssertionError("parsed")):
            self.assertEqual(serde.deserialize(memoryview(payloads[0])), b"x" * 1024)
            self.assertEqual(serde.deserialize(memoryview(payloads[2])),
                             bytearray(b"y" * 70001))
            self.assertEqual(serde.deserialize(memoryview(payloads[-1]).toreadonly()),
                             {"buf": bytearray(b"z" * 5000), "i": 1})

    # The commit line's key is written without json.dumps when it is
    # printable ASCII with no quote or backslash, and as json.dumps writes
    # it either way.
    def test_commit_key_text(self):
        keys = ["k1", "item_10", "a b", "a\"b", "a\\b", "tab\there", "\x7f", "caf\u00e9",
                "\u2603x", "k" * 255, "\x01"]
        want = [json.dumps(k, ensure_ascii=False).encode("utf-8") for k in keys]
        self.assertEqual([client_mod._json_key(k) for k in keys], want)
        with mock.patch.object(client_mod.json, "dumps",
                               side_effect=AssertionError("json.dumps")):
            self.assertEqual(client_mod._json_key("k1"), b'"k1"')
            self.assertEqual(client_mod._json_key("item_10 x"), b'"item_10 x"')


if __name__ == "__main__":
    unittest.main()
