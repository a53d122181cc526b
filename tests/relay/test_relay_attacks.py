#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The relays under attack on a queue's path: two network namespaces joined
by a veth pair, a daemon and a relay in each, UCX over TCP (as
test_relay.py). The writer's host's daemon killed under a stream: its relay
keeps answering, the remote reader gets an error instead of waiting, and
the relay serves again once the daemon is back. Prints PASS/FAIL per case;
SKIP without root or ip netns."""

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_relay as T  # noqa: E402  (its hosts, namespaces and waits)
import test_queue_relay as Q  # noqa: E402  (its readers and messages)
from test_relay import report, sh, skip, wait_for  # noqa: E402

from shmbroker import MessageQueue, errors  # noqa: E402

WAIT = T.WAIT


def answers(host, timeout=1):
    """Whether host's relay answers a status request (within timeout s)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    try:
        s.connect(host.relay_sock)
        s.sendall(b'{"op":"status"}\n')
        return s.makefile("rb").readline().startswith(b"{")
    except OSError:
        return False
    finally:
        s.close()


def case_daemon_killed(a, b):
    """A's daemon killed (SIGKILL) under a stream of A's queue to a reader on
    B: A's relay, which cannot connect again while the daemon is away, must
    not spin on it in its loop (it answered nothing, not even its status,
    and used a CPU until the daemon came back); it keeps answering, and it
    connects again once the daemon is back and carries a new queue."""
    mq = MessageQueue(1, 0, [], Q.SLOT, 8, T.IP_A, socket_path=a.sock)
    rd = Q.Reader(Q.join(mq.export_handle(), 1, b), 10 ** 9)
    rd.start()
    mq.wait_until_ready(WAIT)
    for m in Q.messages(5, 50):
        mq.enqueue(m, timeout=WAIT)
    wait_for("B's reader to read 50", lambda: len(rd.digests) >= 50)
    a.daemon.kill()
    a.daemon.wait()
    # The relay saw the daemon go (its watch) and tried to connect again;
    # give it a few of those tries, then ask it, several times.
    time.sleep(1)
    answered = 0
    for _ in range(3):
        answered += answers(a)
        time.sleep(0.3)
    report(answered == 3, "a relay whose daemon was killed keeps answering while the "
           "daemon is away", "%d of 3 status requests answered" % answered)
    # The stream ended with the daemon: B's reader is told, not left to its
    # own timeout.
    rd.join(WAIT * 2)
    report(not rd.is_alive() and isinstance(rd.error, errors.ShmBrokerError) and
           not isinstance(rd.error, errors.Timeout),
           "B's reader of a stream whose writer's daemon was killed gets an error",
           repr(rd.error))
    try:
        mq.close()
    except errors.ShmBrokerError:
        pass
    a.start_daemon()
    try:
        wait_for("A's relay to connect to the daemon again", lambda: a.relay_conn())
        again = True
    except (AssertionError, OSError, errors.ShmBrokerError):
        again = False
    ok = False
    if again:
        mq = MessageQueue(1, 0, [], Q.SLOT, 8, T.IP_A, socket_path=a.sock)
        rd2 = Q.Reader(Q.join(mq.export_handle(), 1, b), 20)
        rd2.start()
        mq.wait_until_ready(WAIT)
        want = []
        for m in Q.messages(6, 20):
            want.append(hashlib.sha256(m).digest())
            mq.enqueue(m, timeout=WAIT)
        rd2.join(WAIT)
        ok = rd2.digests == want
        mq.close()
    report(again and ok, "the relay connects to its restarted daemon and carries a new "
           "queue", "connected again: %s; messages across: %s" % (again, ok))


def hostile_writer(a, key, port, mode):
    """test_queue_relay's hostile_writer, given the time a peer that asks
    everywhere takes."""
    return Q.hostile_writer(a, key, port, mode, timeout=WAIT * 2)


def case_asks(a, key):
    """A writer's relay that asks for an acknowledgement where no queue
    message is (on its grant of the seat) is disconnected; one that asks on
    every piece of a message, on a batch and on each of 20 messages is kept,
    and acknowledged what was published (its queue here has 4 slots and a
    reader that reads none: 4) while the rest waits for room: the readers'
    relay's thread, stuck publishing the fifth, did not wake its loop to
    acknowledge the four before."""
    rep, state, rc, out, alive = hostile_writer(a, key, T.PORT + 7, "serve-qaskreply")
    report(rc == 0 and alive and state.get("state") == "cut" and "asking" in
           state.get("message", ""), "a writer's relay that asks for an acknowledgement on "
           "its grant of a seat is disconnected",
           "%s; %s; hostile: %d %s" % (rep, state, rc, out))
    rep, state, rc, out, alive = hostile_writer(a, key, T.PORT + 8, "serve-qask")
    words = out.split()
    acks = int(words[words.index("acks") + 1]) if "acks" in words else 0
    # (rc 1: the peer saw no close; its own exit cuts the stream after.)
    report(rep.get("ok") and rc == 1 and "last 4" in out and acks >= 1 and alive,
           "a writer's relay that asks for acknowledgements on every piece, batch and "
           "message is kept and acknowledged what was published",
           "%s; %s; hostile: %d %s" % (rep, state, rc, out))


def rss_kib(pid):
    """A process's resident memory, KiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def case_fetch_flood(a, key):
    """A peer with the key that sends fetches as fast as A's relay reads them,
    reading none of the answers. A's relay handles what each progress of UCX
    brings before the next (it progressed until UCX had nothing, and under a
    flood that is never: the messages, 5 KiB each decoded, piled up
    unhandled, 5 GiB in 10 s), so its memory stays within what it was and
    64 MiB (more under AddressSanitizer); and it lets its loop turn after
    RELAY_DRAIN_MS of them, so its own socket is answered during the flood
    (it was answered only once the flood ended)."""
    pid = a.relay_pid()
    before = rss_kib(pid)
    peak = before
    env = dict(os.environ, UCX_TLS="tcp", UCX_WARN_UNUSED_ENV_VARS="n", FLOOD_SECONDS="20")
    p = subprocess.Popen(["ip", "netns", "exec", T.NS_B, T.HOSTILE, "%s:%d" % (T.IP_A, T.PORT),
                          key, "fetchflood"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    start = time.monotonic()
    heard = None
    while p.poll() is None:
        peak = max(peak, rss_kib(pid))
        if peak - before > 1 << 20:
            break  # far past the bound: no need to let it eat the machine
        elapsed = time.monotonic() - start
        if heard is None and elapsed > 2:
            # 10 s given, of the 18 the flood goes on for.
            heard = answers(a, timeout=10) and p.poll() is None
        elif heard is not None and elapsed > 5:
            break  # 5 s of flood, and a status request during it
        time.sleep(0.1)
    flooding = p.poll() is None
    p.kill()
    out, err = p.communicate()
    grew = (peak - before) >> 10
    # An AddressSanitizer build keeps what is freed in its quarantine (256 MiB
    # by default) and rounds each block up: it levels off near 400 MiB more.
    bound = 64 + (512 if "address" in T.BUILD else 0)
    detail = "grew %d MiB (at most %d); hostile %s: %s %s" % (
        grew, bound, "still flooding" if flooding else "ended %d" % p.returncode,
        out.strip(), err.strip()[-300:])
    report(grew < bound and answers(a) and a.relay.poll() is None,
           "a keyed peer flooding A's relay with fetches it never reads the answers of "
           "leaves its memory bounded", detail)
    report(bool(heard) and flooding, "A's relay answers its socket while a keyed peer "
           "floods it", "answered during the flood: %s; %s" % (heard, detail))


def main():
    if os.geteuid() != 0:
        skip("needs root for ip netns; run make test as root")
    for binary in (T.DAEMON, T.RELAY, T.HOSTILE):
        if not os.access(binary, os.X_OK):
            print("FAIL: relay attacks (%s is not built)" % binary)
            sys.exit(1)
    r = sh("ip", "netns", "add", T.NS_A, check=False)
    if r.returncode != 0:
        skip("ip netns is not available here: " + r.stderr.strip())
    hosts = []
    tmp = tempfile.mkdtemp(prefix="shmb-relay-attacks-")
    try:
        key = T.make_link(tmp)
        a = T.Host(tmp, "A", T.NS_A, T.IP_A, "B", T.IP_B, key)
        hosts.append(a)
        b = T.Host(tmp, "B", T.NS_B, T.IP_B, "A", T.IP_A, key)
        hosts.append(b)
        wait_for("the relays to connect both ways", lambda: a.connected() and b.connected())
        case_asks(a, key)
        case_fetch_flood(a, key)
        case_daemon_killed(a, b)
    except (AssertionError, errors.ShmBrokerError) as e:
        report(False, "relay attacks setup or wait", repr(e))
    finally:
        for h in hosts:
            h.stop()
        for ns in (T.NS_A, T.NS_B):
            sh("ip", "netns", "del", ns, check=False)
        if not T.failures:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print("logs kept in " + tmp)
            for n in sorted(os.listdir(tmp)):
                if n.endswith(".log"):
                    with open(os.path.join(tmp, n), errors="replace") as f:
                        print("---- %s\n%s" % (n, f.read()[-3000:]))
    sys.exit(1 if T.failures else 0)


if __name__ == "__main__":
    main()
