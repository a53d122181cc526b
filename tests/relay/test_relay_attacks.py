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


def answers(host):
    """Whether host's relay answers a status request (within a second)."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1)
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


def main():
    if os.geteuid() != 0:
        skip("needs root for ip netns; run make test as root")
    for binary in (T.DAEMON, T.RELAY):
        if not os.access(binary, os.X_OK):
            print("FAIL: relay attacks (%s is not built)" % binary)
            sys.exit(1)
    r = sh("ip", "netns", "add", T.NS_A, check=False)
    if r.returncode != 0:
        skip("ip netns is not available here: " + r.stderr.strip())
    hosts = []
    tmp = tempfile.mkdtemp(prefix="shmb-relay-attacks-")
    try:
        sh("ip", "netns", "add", T.NS_B)
        sh("ip", "link", "add", T.TAG + "va", "type", "veth", "peer", "name", T.TAG + "vb")
        sh("ip", "link", "set", T.TAG + "va", "netns", T.NS_A)
        sh("ip", "link", "set", T.TAG + "vb", "netns", T.NS_B)
        sh("ip", "-n", T.NS_A, "addr", "add", T.IP_A + "/24", "dev", T.TAG + "va")
        sh("ip", "-n", T.NS_B, "addr", "add", T.IP_B + "/24", "dev", T.TAG + "vb")
        for ns, dev in ((T.NS_A, T.TAG + "va"), (T.NS_B, T.TAG + "vb")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        key = os.path.join(tmp, "key")
        with open(key, "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(key, 0o600)
        a = T.Host(tmp, "A", T.NS_A, T.IP_A, "B", T.IP_B, key)
        hosts.append(a)
        b = T.Host(tmp, "B", T.NS_B, T.IP_B, "A", T.IP_A, key)
        hosts.append(b)
        wait_for("the relays to connect both ways", lambda: a.connected() and b.connected())
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
