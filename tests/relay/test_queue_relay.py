#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Queues with readers on other hosts: two network namespaces joined by a
veth pair, a daemon and a relay in each, UCX over TCP (as test_relay.py).
A MessageQueue's writer on A with a reader on A and two on B: 10,000
messages of random sizes, a third larger than a slot, arrive byte-identical
and in order everywhere. B's relay killed mid-stream: A's writer goes on,
B's readers get ConnectionLost, and B's relay restarted serves the new
messages to a reader that joins again, saying how many it missed. Prints
PASS/FAIL per case; SKIP without root or ip netns."""

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_relay as T  # noqa: E402  (its hosts, namespaces and waits)
from test_relay import report, sh, skip, wait_for  # noqa: E402

import shmbroker  # noqa: E402
from shmbroker import MessageQueue, errors  # noqa: E402

SLOT = 4096
MESSAGES = 10000
WAIT = T.WAIT


def messages(seed, n):
    """n messages of random sizes, a third of them larger than a slot."""
    rnd = random.Random(seed)
    for i in range(n):
        size = rnd.randint(SLOT + 1, 4 * SLOT) if i % 3 == 2 else rnd.randint(0, SLOT // 2)
        yield rnd.randbytes(size)


class Reader(threading.Thread):
    """A reader that digests what it reads until the end, an error or n."""

    def __init__(self, mq, n):
        super().__init__(daemon=True)
        self.mq, self.n = mq, n
        self.digests = []
        self.error = None

    def run(self):
        try:
            self.mq.wait_until_ready(WAIT)
            while len(self.digests) < self.n:
                self.digests.append(hashlib.sha256(self.mq.dequeue(WAIT)).digest())
        except Exception as e:  # noqa: BLE001  (the case reports it)
            self.error = e


def join(handle, rank, host):
    return MessageQueue.create_from_handle(handle, rank, client=host.client())


def case_order(a, b):
    mq = MessageQueue(3, 1, [1], SLOT, 8, T.IP_A, socket_path=a.sock)
    handle = mq.export_handle()
    readers = [Reader(join(handle, 1, a), MESSAGES), Reader(join(handle, 2, b), MESSAGES),
               Reader(join(handle, 3, b), MESSAGES)]
    for r in readers:
        r.start()
    mq.wait_until_ready(WAIT)
    want = []
    start = time.monotonic()
    for m in messages(1, MESSAGES):
        want.append(hashlib.sha256(m).digest())
        mq.enqueue(m, timeout=WAIT)
    for r in readers:
        r.join(WAIT * 4)
    took = time.monotonic() - start
    got = [(len(r.digests), r.error) for r in readers]
    report(all(r.digests == want and r.error is None for r in readers),
           "a queue with a writer on A and readers on A and B: %d messages of random sizes "
           "(a third larger than a slot) byte-identical and in order everywhere" % MESSAGES,
           "read, error per reader: %s; %.1f s" % (got, took))
    print("    (%d messages to 3 readers, 2 on the other host, in %.1f s)" % (MESSAGES, took))
    for r in readers:
        r.mq.close()
    mq.close()


def case_cut(a, b):
    mq = MessageQueue(2, 1, [1], SLOT, 8, T.IP_A, socket_path=a.sock)
    handle = mq.export_handle()
    local = Reader(join(handle, 1, a), 10 ** 9)
    remote = Reader(join(handle, 2, b), 10 ** 9)
    local.start()
    remote.start()
    mq.wait_until_ready(WAIT)
    sent = [0]
    stop = threading.Event()
    writer_error = []

    def write():
        try:
            for m in messages(2, 10 ** 9):
                if stop.is_set():
                    return
                mq.enqueue(m, timeout=WAIT)
                sent[0] += 1
        except Exception as e:  # noqa: BLE001
            writer_error.append(e)

    w = threading.Thread(target=write, daemon=True)
    w.start()
    wait_for("B's reader to read 300 messages", lambda: len(remote.digests) >= 300)
    os.kill(b.relay_pid(), signal.SIGKILL)
    b.relay.wait()
    at_kill = sent[0]
    remote.join(WAIT)
    wait_for("A's writer to go on after B's relay died",
             lambda: sent[0] >= at_kill + 2000 or writer_error)
    report(not writer_error and sent[0] >= at_kill + 2000,
           "B's relay killed mid-stream: A's writer goes on (%d messages since)"
           % (sent[0] - at_kill), "writer: %s" % writer_error)
    report(isinstance(remote.error, errors.ConnectionLost) and not remote.is_alive(),
           "B's relay killed mid-stream: B's reader gets ConnectionLost, not the end of the "
           "stream", "after %d messages: %r" % (len(remote.digests), remote.error))
    remote.mq.close()
    b.start_relay()
    wait_for("B's restarted relay to connect", lambda: a.connected() and b.connected())
    again = join(handle, 2, b)
    missed = again.missed
    back = Reader(again, 200)
    back.start()
    back.join(WAIT * 2)
    stop.set()
    w.join(WAIT)
    local.mq.close()
    local.join(WAIT)
    ok = len(back.digests) == 200 and back.error is None
    # What came after the return is what A's local reader read, in order.
    if ok:
        start = local.digests.index(back.digests[0]) if back.digests[0] in local.digests else -1
        ok = start >= 0 and local.digests[start:start + 200] == back.digests
    report(ok and missed > 0,
           "B's relay restarted serves new messages, in order, and says what it missed "
           "(%d)" % missed, "read %d, error %r, missed %d" % (len(back.digests), back.error,
                                                              missed))
    again.close()
    mq.close()


class SlowReader(Reader):
    """A reader that takes 2 ms over each message."""

    def run(self):
        try:
            self.mq.wait_until_ready(WAIT)
            while len(self.digests) < self.n:
                self.digests.append(hashlib.sha256(self.mq.dequeue(WAIT)).digest())
                time.sleep(0.002)
        except Exception as e:  # noqa: BLE001
            self.error = e


def case_slow_reader(a, b):
    """A slow reader on B holds the writer back through the relays' window
    (at most 128 messages or 64 MiB on their way), as a slow local reader
    does: nothing piles up without bound, nothing is lost, the stream is
    not cut."""
    n = 600
    mq = MessageQueue(2, 1, [1], SLOT, 4, T.IP_A, socket_path=a.sock)
    handle = mq.export_handle()
    local = Reader(join(handle, 1, a), n)
    slow = SlowReader(join(handle, 2, b), n)
    local.start()
    slow.start()
    mq.wait_until_ready(WAIT)
    want = []
    peak = 0
    for m in messages(4, n):
        want.append(hashlib.sha256(m).digest())
        mq.enqueue(m, timeout=WAIT)
        peak = max(peak, len(want) - len(slow.digests))
    slow.join(WAIT * 2)
    local.join(WAIT)
    report(slow.digests == want and slow.error is None and peak <= 200,
           "a slow reader on B holds the writer back through the relays' window "
           "(the writer at most %d messages ahead of it)" % peak,
           "read %d, error %r, peak %d" % (len(slow.digests), slow.error, peak))
    for r in (local, slow):
        r.mq.close()
    mq.close()


class LateReader(Reader):
    """A reader that joins, then lets the writer fill the way for a second
    before it reads."""

    def run(self):
        try:
            self.mq.wait_until_ready(WAIT)
            time.sleep(1)
            while len(self.digests) < self.n:
                self.digests.append(hashlib.sha256(self.mq.dequeue(WAIT)).digest())
        except Exception as e:  # noqa: BLE001
            self.error = e


def case_batch(a, b):
    """Small messages that wait together cross between the relays together
    (batches): 2000 of them, B's reader late so that they pile up behind
    the window, reach B byte-identical and in order in fewer messages
    between the relays than there are queue messages (B's relay counts
    what came from A)."""
    n = 2000

    def from_a():
        st = T.ask(b.relay_sock, {"op": "status"})
        return sum(p["messages_in"] for p in st["peers"] if p["name"] == "A")

    mq = MessageQueue(2, 1, [1], SLOT, 64, T.IP_A, socket_path=a.sock)
    handle = mq.export_handle()
    local = Reader(join(handle, 1, a), n)
    late = LateReader(join(handle, 2, b), n)
    local.start()
    late.start()
    mq.wait_until_ready(WAIT)
    before = from_a()
    rnd = random.Random(6)
    want = []
    for i in range(n):
        m = rnd.randbytes(rnd.randint(0, 200))
        want.append(hashlib.sha256(m).digest())
        mq.enqueue(m, timeout=WAIT)
    late.join(WAIT * 2)
    local.join(WAIT)
    sent = from_a() - before
    report(late.digests == want and late.error is None and local.digests == want
           and sent < n,
           "%d small messages cross between the relays in %d messages (batches), "
           "byte-identical and in order" % (n, sent),
           "read %d (error %r), locally %d, %d messages from A" % (
               len(late.digests), late.error, len(local.digests), sent))
    for r in (local, late):
        r.mq.close()
    mq.close()


def case_published_by_loop(a, b):
    """A message that arrives while B's stream thread waits idle is
    published by B's relay's loop at once (one wake-up less on its way):
    300 small messages 2 ms apart reach B byte-identical and in order, and
    B's relay says its loop published some of them; a message larger than
    a slot is still published (by the thread) in order."""
    n = 300
    mq = MessageQueue(2, 1, [1], SLOT, 16, T.IP_A, socket_path=a.sock)
    handle = mq.export_handle()
    local = Reader(join(handle, 1, a), n + 2)
    remote = Reader(join(handle, 2, b), n + 2)
    local.start()
    remote.start()
    mq.wait_until_ready(WAIT)
    rnd = random.Random(7)
    sent = [rnd.randbytes(rnd.randint(0, 300)) for _ in range(n)]
    sent[n // 2:n // 2] = [rnd.randbytes(3 * SLOT), b"after the large one"]
    for m in sent:
        mq.enqueue(m, timeout=WAIT)
        time.sleep(0.002)  # spaced: the thread is idle when the next comes
    remote.join(WAIT)
    local.join(WAIT)
    st = T.ask(b.relay_sock, {"op": "status"})
    by_loop = [q.get("published_by_loop", 0) for q in st.get("queues", [])
               if q["queue"] == mq.name and q["direction"] == "in"]
    want = [hashlib.sha256(m).digest() for m in sent]
    report(remote.digests == want and remote.error is None and by_loop and by_loop[0] > 0,
           "messages that find B's stream thread idle are published by B's relay's "
           "loop (%s of %d), byte-identical and in order" % (by_loop, len(sent)),
           "read %d (error %r), by the loop %s" % (len(remote.digests), remote.error,
                                                   by_loop))
    # A's side of the same: its stream thread sent them itself (a worker
    # that takes calls from any thread), waking A's loop to send at most
    # once (the first message may find the seat's answer not yet sent).
    out = [q for q in T.ask(a.relay_sock, {"op": "status"}).get("queues", [])
           if q["queue"] == mq.name and q["direction"] == "out"]
    report(len(out) == 1 and out[0].get("sent_by_thread", 0) > out[0]["wire_messages"] // 2
           and out[0].get("handoffs", 2) <= 1 and remote.digests == want,
           "A's stream thread sends what it reads itself, without waking A's loop",
           repr(out))
    # And B acknowledged only what A asked for (every third send when they
    # come one at a time), not each message it published.
    ins = [q for q in st.get("queues", []) if q["queue"] == mq.name and q["direction"] == "in"]
    report(len(ins) == 1 and 0 < ins[0].get("acks", 0) <= len(sent) // 2,
           "B acknowledges the messages A asks it to, not each one it publishes",
           "%r; %r" % (ins, out))
    for r in (local, remote):
        r.mq.close()
    mq.close()


def case_nagle(a, key):
    """Nagle's rule on the writer's relay, bounded by what is published: a
    peer subscribes to A's queue and acknowledges nothing; four messages,
    each written once the one before came, go at once, one active message
    each (a lone message is never held); nine written after them, while
    four sends are unacknowledged (FWD_HOLD_SENDS), wait for an
    acknowledgement (none came in 2 s), then cross together in one active
    message, in order."""
    import subprocess
    mq = MessageQueue(1, 0, [], SLOT, 64, T.IP_A, name="nagleq", socket_path=a.sock)
    peer = subprocess.Popen(["ip", "netns", "exec", T.NS_B, T.HOSTILE,
                             "%s:%d" % (T.IP_A, T.PORT), key, "qnagle"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, UCX_TLS="tcp"))

    def ask(line):
        peer.stdin.write(line + "\n")
        peer.stdin.flush()
        return peer.stdout.readline().strip()

    lines = []
    try:
        lines.append(peer.stdout.readline().strip())  # subscribed 0
        for i in range(4):
            mq.enqueue(b"nagle-%02d" % i, timeout=WAIT)
            lines.append(ask("wait %d" % (i + 1)))
        for i in range(4, 13):
            mq.enqueue(b"nagle-%02d" % i, timeout=WAIT)
        lines.append(ask("hold"))
        lines.append(ask("ack 13"))
        peer.wait(WAIT)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait(10)
        mq.close()
    want = ["subscribed 0", "got 1 1", "got 2 2", "got 3 3", "got 4 4", "held 4 4",
            "acked 5 13 0"]
    report(lines == want,
           "a lone message goes at once; messages written while 4 sends are "
           "unacknowledged wait for an acknowledgement, then cross together, in order",
           "%r (want %r) %s" % (lines, want, peer.stderr.read().strip()[-300:]))


def case_rejoin_and_end(a, b):
    """A remote reader that leaves and joins again, three times, takes its
    old place (the queue has one remote seat); when the writer leaves, the
    remote reader gets EndOfQueue once it has read everything, as a local
    one does, and not ConnectionLost."""
    mq = MessageQueue(2, 1, [1], SLOT, 4, T.IP_A, socket_path=a.sock)
    handle = mq.export_handle()
    local = Reader(join(handle, 1, a), 10 ** 9)
    local.start()
    errors_seen = []
    for i in range(3):
        try:
            r = join(handle, 2, b)
        except errors.ShmBrokerError as e:
            errors_seen.append(e)
            break
        rd = Reader(r, 5)
        rd.start()
        mq.wait_until_ready(WAIT)
        for m in messages(10 + i, 5):
            mq.enqueue(m, timeout=WAIT)
        rd.join(WAIT)
        if len(rd.digests) != 5 or rd.error:
            errors_seen.append((i, len(rd.digests), rd.error))
        if i < 2:
            r.close()
    last = r
    report(not errors_seen, "a remote reader that leaves and joins again takes its old "
           "place (3 times, one remote seat)", str(errors_seen))
    mq.enqueue(b"the last one", timeout=WAIT)
    mq.close()
    try:
        got = last.dequeue(WAIT)
        end = last.dequeue(WAIT)
    except errors.EndOfQueue as e:
        end = e
    except errors.ShmBrokerError as e:
        got, end = None, e
    report(got == b"the last one" and isinstance(end, errors.EndOfQueue),
           "the writer gone, a remote reader reads what it sent and then gets EndOfQueue",
           "got %r, then %r" % (got, end))
    last.close()
    local.join(WAIT)
    local.mq.close()


def case_many_queues(a, b):
    """A relay serves queue after queue over its life (vLLM makes each
    afresh): 40 of them, each with a remote reader that reads its message
    and the end, and the readers' relay keeps no more than 16 ended streams
    to say why they ended."""
    bad = []
    for i in range(40):
        mq = MessageQueue(2, 1, [1], SLOT, 4, T.IP_A, socket_path=a.sock)
        local = join(mq.export_handle(), 1, a)
        try:
            remote = join(mq.export_handle(), 2, b)
        except errors.ShmBrokerError as e:
            bad.append((i, e))
            local.close()
            mq.close()
            break
        mq.wait_until_ready(WAIT)
        mq.enqueue(b"one", timeout=WAIT)
        mq.close()
        try:
            got = remote.dequeue(WAIT)
            remote.dequeue(WAIT)
            bad.append((i, "no end after %r" % got))
        except errors.EndOfQueue:
            pass
        except errors.ShmBrokerError as e:
            bad.append((i, e))
        remote.close()
        local.close()
    kept = [q for q in T.ask(b.relay_sock, {"op": "status"}).get("queues", [])
            if q["direction"] == "in"]
    report(not bad and len(kept) <= 17,
           "40 queues one after another reach their remote readers, and the readers' "
           "relay keeps %d ended streams (at most 16 and the last)" % len(kept),
           "%s; kept %d" % (bad[:3], len(kept)))


def hostile_writer(a, key, port, mode, timeout=WAIT):
    """Relay E on A's daemon dials relay-hostile-peer MODE and subscribes to
    its queue, of 4 slots here, whose one reader seat is held and reads
    nothing. Returns E's answer, its stream's state, the peer's exit status
    and output, and whether E still runs."""
    import subprocess
    name = "evilq-" + mode[7:]
    evil = subprocess.Popen(["ip", "netns", "exec", T.NS_B, T.HOSTILE, "%s:%d" % (T.IP_B, port),
                             key, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, UCX_TLS="tcp", UCX_CM_REUSEADDR="y"))
    e_sock = os.path.join(os.path.dirname(key), "E-%s.relay" % mode)
    e_log = open(os.path.join(os.path.dirname(key), "E-relay.log"), "ab")
    e = None
    c = a.client()
    try:
        c._call({"op": "queue_create", "name": name, "seats": 1, "slots": 4,
                 "slot_size": 4096, "temporary": True})
        c._call_fds({"op": "queue_open", "name": name, "role": "reader", "seat": 0})
        evil.stdout.readline()  # "listening"
        e = subprocess.Popen(["ip", "netns", "exec", T.NS_A, T.RELAY, "--key-file", key,
                              "--socket", a.sock, "--relay-socket", e_sock, "--name", "E",
                              "--peer", "EVIL=%s:%d" % (T.IP_B, port)],
                             stdout=e_log, stderr=e_log, env=dict(os.environ, UCX_TLS="tcp"))
        wait_for("E to prove the key to the hostile peer", lambda: os.path.exists(e_sock)
                 and any(p["state"] == "connected"
                         for p in T.ask(e_sock, {"op": "status"})["peers"]))
        rep = T.ask(e_sock, {"op": "queue_subscribe", "peer": "EVIL", "queue": name,
                             "seat_from": 0, "seat_to": 1, "seats": 1, "slots": 4,
                             "slot_size": 4096})
        out, err = evil.communicate(timeout=timeout)
        state = T.ask(e_sock, {"op": "queue_state", "peer": "EVIL", "queue": name})
        return rep, state, evil.returncode, out.strip() + " " + err.strip()[-300:], \
            e.poll() is None
    finally:
        for p in (e, evil):
            if p and p.poll() is None:
                p.terminate()
                p.wait(10)
        e_log.close()
        c.close()
        if os.path.exists(e_sock):
            os.unlink(e_sock)


def hostile_writer_relay(a, key, port, mode, what):
    """hostile_writer, whose peer misbehaves: E must close it, cut the
    stream and keep serving."""
    try:
        rep, state, rc, out, alive = hostile_writer(a, key, port, mode)
        report(rep.get("ok") and rc == 0 and alive and state.get("state") == "cut",
               "a writer's relay that %s is disconnected, its stream cut" % what,
               "%s; %s; hostile: %s" % (rep, state, out))
    except (AssertionError, errors.ShmBrokerError) as exc:
        report(False, "a writer's relay that %s" % what, repr(exc))


def case_hostile(a, b, key):
    """Queue messages from a peer that proved the key are hostile input too:
    a bad queue name, seats out of order, a piece past its message, an
    answer to a subscription never made and a batch of messages whose
    lengths overrun it, past 64 messages, of none, or holding fewer than it
    says close that peer; a subscription to a queue that does not exist,
    and a well-formed batch of a stream that ended, are answered or dropped,
    and the peer kept. The relay's
    socket refuses bad subscriptions. Then both hosts still carry a queue."""
    import subprocess
    for mode, want_closed, what in (
            ("qname", True, "subscribes to a queue name with a newline"),
            ("qseats", True, "asks for seats 5 to 2"),
            ("qpiece", True, "sends a piece past the end of its message"),
            ("qstray", True, "answers a subscription never made"),
            ("qbatch-overrun", True, "sends a batch whose one length overruns it"),
            ("qbatch-count", True, "sends a batch of 65 messages (at most 64)"),
            ("qbatch-zero", True, "sends a batch of no message"),
            ("qbatch-short", True, "sends a batch that says 3 messages and holds 2"),
            ("qaskbad", True, "asks for an acknowledgement of a fetch"),
            ("qbatch-ok", False, "sends a well-formed batch for a stream that ended"),
            ("qnoqueue", False, "subscribes to a queue that does not exist")):
        r = subprocess.run(["ip", "netns", "exec", T.NS_B, T.HOSTILE, "%s:%d" % (T.IP_A, T.PORT),
                            key, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, timeout=WAIT * 2, env=dict(os.environ, UCX_TLS="tcp"))
        closed = r.returncode == 0
        report(closed == want_closed and r.returncode in (0, 1),
               "a peer that %s is %s" % (what, "disconnected" if want_closed else "kept"),
               r.stdout.strip() + " " + r.stderr.strip()[-300:])
    # A writer's relay that sends a batch inside a message it sends in
    # pieces, or 192 messages in batches without waiting for their
    # acknowledgement while this host's reader reads none: relay E on A's
    # daemon subscribes to its queue, and closes it.
    for port, mode, what in ((T.PORT + 5, "serve-qinpieces",
                              "sends a batch inside a message in pieces"),
                             (T.PORT + 6, "serve-qflood",
                              "sends 3 batches of 64 messages past the window of 128")):
        hostile_writer_relay(a, key, port, mode, what)
    bad = []
    for req, code in (({"op": "queue_subscribe", "peer": "A", "queue": "a\nb", "seat_from": 1,
                        "seat_to": 2, "seats": 1, "slots": 2, "slot_size": 64}, "EINVAL"),
                      ({"op": "queue_subscribe", "peer": "A", "queue": "q", "seat_from": 3,
                        "seat_to": 2, "seats": 1, "slots": 2, "slot_size": 64}, "EINVAL"),
                      ({"op": "queue_subscribe", "peer": "nobody", "queue": "q",
                        "seat_from": 1, "seat_to": 2, "seats": 1, "slots": 2,
                        "slot_size": 64}, "ENOTCONN"),
                      ({"op": "queue_subscribe", "peer": "A", "queue": "no-such-queue",
                        "seat_from": 0, "seat_to": 1, "seats": 1, "slots": 2,
                        "slot_size": 64}, "ENOENT"),
                      ({"op": "queue_state", "peer": "A", "queue": "never"}, "ENOENT")):
        rep = T.ask(b.relay_sock, req)
        if rep.get("error") != code:
            bad.append((req, rep))
    report(not bad, "the relay's socket refuses bad subscriptions with their error", str(bad))
    mq = MessageQueue(2, 1, [1], SLOT, 4, T.IP_A, socket_path=a.sock)
    readers = [Reader(join(mq.export_handle(), 1, a), 50),
               Reader(join(mq.export_handle(), 2, b), 50)]
    for r in readers:
        r.start()
    mq.wait_until_ready(WAIT)
    want = []
    for m in messages(3, 50):
        want.append(hashlib.sha256(m).digest())
        mq.enqueue(m, timeout=WAIT)
    for r in readers:
        r.join(WAIT)
        r.mq.close()
    mq.close()
    report(all(r.digests == want for r in readers) and a.relay.poll() is None
           and b.relay.poll() is None,
           "both hosts still carry a queue after the hostile peers",
           str([(len(r.digests), r.error) for r in readers]))


class ThreadGroup:
    """vLLM's StatelessProcessGroup as create_from_process_group uses it
    (rank, world_size, broadcast_obj, all_gather_obj), for members that are
    threads of this process, each naming its own host's daemon."""

    def __init__(self, shared, rank):
        self.shared, self.rank = shared, rank
        self.world_size = len(shared["slots"])

    def all_gather_obj(self, obj):
        s = self.shared
        s["slots"][self.rank] = obj
        s["barrier"].wait(WAIT)
        out = list(s["slots"])
        s["barrier"].wait(WAIT)
        return out

    def broadcast_obj(self, obj, src):
        return self.all_gather_obj(obj)[src]


def run_group(socks, member):
    """member(group, sock) in a thread per socket; {rank: result or error}."""
    shared = {"slots": [None] * len(socks), "barrier": threading.Barrier(len(socks))}
    out = {}

    def run(rank):
        try:
            out[rank] = member(ThreadGroup(shared, rank), socks[rank])
        except Exception as e:  # noqa: BLE001  (the case reports it)
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(len(socks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 4)
    return out


def group_member(group, sock, n):
    """A member of create_from_process_group's queue: writer_rank 0 writes
    n messages, the others read them ("wrote", or whether all arrived
    byte-identical and in order)."""
    mq = MessageQueue.create_from_process_group(group, SLOT, 8, writer_rank=0,
                                                socket_path=sock)
    try:
        if group.rank == 0:
            for m in messages(7, n):
                mq.enqueue(m, timeout=WAIT)
            return "wrote"
        want = [hashlib.sha256(m).digest() for m in messages(7, n)]
        return [hashlib.sha256(mq.dequeue(WAIT)).digest() for _ in range(n)] == want
    finally:
        mq.close()


def case_process_group(a, b):
    """create_from_process_group over a group with members on both hosts:
    the writer's host's members read it there, the others through the
    relays; a member whose host has no daemon fails every member."""
    n = 2000

    def member(group, sock):
        return group_member(group, sock, n)

    out = run_group([a.sock, a.sock, b.sock, b.sock], member)
    report(out == {0: "wrote", 1: True, 2: True, 3: True},
           "create_from_process_group with members on two hosts: the writer's host reads "
           "in place, the other through the relays, %d messages byte-identical and in order"
           % n, repr(out))
    elsewhere = os.path.join(os.path.dirname(a.sock), "nowhere.sock")
    out = run_group([a.sock, b.sock, elsewhere], member)
    report(sorted(out) == [0, 1, 2] and all(isinstance(e, errors.ShmBrokerError)
                                            for e in out.values())
           and a.client().queue_list() == [],
           "create_from_process_group with a member whose host has no daemon: every member "
           "raises, and no queue is left on the writer's host", repr(out))


def case_host_ip_of_another_peer(a, b):
    """The writer's VLLM_HOST_IP naming another peer of the readers' relay
    (an environment copied from another node): the readers still subscribe
    to the writer's relay, named in the handle by the relay itself, not to
    the peer at that address."""
    b.relay.send_signal(signal.SIGTERM)
    b.relay.wait(WAIT)
    env = dict(os.environ, UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n")
    # A third node's relay, down: its address is what the writer says.
    b.relay = subprocess.Popen(
        ["ip", "netns", "exec", b.ns, T.RELAY, "--key-file", b.key, "--socket", b.sock,
         "--listen", "%s:%d" % (b.ip, T.PORT), "--name", b.name,
         "--peer", "C=127.0.0.1:%d" % (T.PORT + 9),
         "--peer", "%s=%s:%d" % (b.peer_name, b.peer_ip, T.PORT)],
        stdout=b.log, stderr=b.log, env=env)
    try:
        wait_for("the relays to connect both ways", lambda: a.connected() and b.connected()
                 and any(p["name"] == "A" and p["state"] == "connected"
                         for p in b.status()["peers"]))
        os.environ["VLLM_HOST_IP"] = "127.0.0.1"
        try:
            out = run_group([a.sock, b.sock], lambda group, sock: group_member(group, sock, 50))
        finally:
            del os.environ["VLLM_HOST_IP"]
        report(out == {0: "wrote", 1: True},
               "create_from_process_group whose writer's VLLM_HOST_IP is another peer's "
               "address: the remote member reads from the writer's relay all the same",
               repr(out))
    finally:
        b.relay.send_signal(signal.SIGTERM)
        b.relay.wait(WAIT)
        b.start_relay()
        wait_for("the relays to connect both ways", lambda: a.connected() and b.connected())


class RelayKillingGroup(ThreadGroup):
    """A ThreadGroup whose writer kills its host's relay just before it
    sends the handle: the queue made and exported, the remote members'
    subscriptions then find the writer's relay gone."""

    def __init__(self, shared, rank, host):
        super().__init__(shared, rank)
        self.host = host

    def broadcast_obj(self, obj, src):
        if self.rank == src and obj is not None and self.host.relay.poll() is None:
            self.host.relay.kill()
            self.host.relay.wait(WAIT)
        return super().broadcast_obj(obj, src)


def case_writer_relay_gone_during_join(a, b):
    """The writer's relay killed between the queue's making and the remote
    members' subscriptions: every member raises, and neither host keeps a
    queue (the remote member's copy included)."""
    socks = [a.sock, b.sock]
    shared = {"slots": [None] * 2, "barrier": threading.Barrier(2)}
    out = {}

    def run(rank):
        try:
            group = RelayKillingGroup(shared, rank, a)
            out[rank] = MessageQueue.create_from_process_group(group, SLOT, 8, writer_rank=0,
                                                               socket_path=socks[rank])
        except Exception as e:  # noqa: BLE001  (the case reports it)
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 4)
    left = {}

    def nothing_left():
        for name, host in (("A", a), ("B", b)):
            with host.client() as c:
                left[name] = [q["name"] for q in c.queue_list()]
        return not left["A"] and not left["B"]

    try:
        wait_for("no queue left", nothing_left)
        gone = True
    except AssertionError:
        gone = False
    report(sorted(out) == [0, 1] and all(isinstance(e, errors.ShmBrokerError)
                                         for e in out.values()) and gone,
           "create_from_process_group whose writer's relay dies during the join: every "
           "member raises and neither host keeps a queue", "%r; left %r" % (out, left))
    for m in out.values():
        if isinstance(m, MessageQueue):
            m.close()
    a.start_relay()
    wait_for("the relays to connect both ways", lambda: a.connected() and b.connected())


def main():
    if os.geteuid() != 0:
        skip("needs root for ip netns; run make test as root")
    for binary in (T.DAEMON, T.RELAY, T.HOSTILE):
        if not os.access(binary, os.X_OK):
            print("FAIL: queue relay (%s is not built)" % binary)
            sys.exit(1)
    r = sh("ip", "netns", "add", T.NS_A, check=False)
    if r.returncode != 0:
        skip("ip netns is not available here: " + r.stderr.strip())
    hosts = []
    tmp = tempfile.mkdtemp(prefix="shmb-qrelay-")
    try:
        key = T.make_link(tmp)
        a = T.Host(tmp, "A", T.NS_A, T.IP_A, "B", T.IP_B, key)
        hosts.append(a)
        b = T.Host(tmp, "B", T.NS_B, T.IP_B, "A", T.IP_A, key)
        hosts.append(b)
        wait_for("the relays to connect both ways", lambda: a.connected() and b.connected())
        case_order(a, b)
        case_process_group(a, b)
        case_host_ip_of_another_peer(a, b)
        case_writer_relay_gone_during_join(a, b)
        case_cut(a, b)
        case_slow_reader(a, b)
        case_batch(a, b)
        case_published_by_loop(a, b)
        case_nagle(a, key)
        case_rejoin_and_end(a, b)
        case_many_queues(a, b)
        case_hostile(a, b, key)
    except (AssertionError, errors.ShmBrokerError) as e:
        report(False, "queue relay setup or wait", repr(e))
    finally:
        for h in hosts:
            h.stop()
        for ns in (T.NS_A, T.NS_B):
            sh("ip", "netns", "del", ns, check=False)
        if not T.failures:
            shutil.rmtree(tmp, ignore_errors=True)
        if T.failures:
            print("logs kept in " + tmp)
            for n in sorted(os.listdir(tmp)):
                if n.endswith(".log"):
                    with open(os.path.join(tmp, n), errors="replace") as f:
                        tail = f.read()[-3000:]
                    print("---- %s\n%s" % (n, tail))
    sys.exit(1 if T.failures else 0)


if __name__ == "__main__":
    main()
