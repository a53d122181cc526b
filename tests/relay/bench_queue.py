#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The relay's remote-queue row: one-way latency (p50, p99) and messages/s
of a MessageQueue whose reader is on another host (two network namespaces
joined by a veth pair, UCX over TCP, the relays carrying the messages),
against ZeroMQ PUB/SUB over TCP between the same namespaces (vLLM's remote
path), both sending pickled 64-byte messages from Python. Beside them, what
bounds each figure, from the same run: the same MessageQueue with its
reader on the writer's host (no relay: the Python queue's own floor), and
UCX's active messages over the same veth (ucx_perftest ucp_am_lat, one way,
and ucp_am_bw of 64-byte messages: the relays' link), when ucx_perftest is
there. Needs root, ip netns and python3-zmq. BENCH_QUICK=1 for fewer
messages; --rounds N runs every row N times, interleaved, and prints each;
--local-reader thread|process|none: the relays' row's reader on the
writer's host is a thread of the writer's process (the default, as in the
runs of record), a process of its own, or absent.
    python3 tests/relay/bench_queue.py [--rounds N] [--local-reader WHERE]"""

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_relay as T  # noqa: E402

QUICK = bool(os.environ.get("BENCH_QUICK"))
LAT_N = 500 if QUICK else 2000      # messages spaced out: latency without queueing
LAT_GAP = 0.001                     # seconds between them
RATE_N = 5000 if QUICK else 20000   # messages back to back: throughput
PAYLOAD = 64
LOCAL_READER = "thread"             # --local-reader: see bench_mq
ZMQ_PORT = 13399


def stats(lat_ns, first_ns, last_ns, n):
    lat = sorted(lat_ns)
    return {"p50_us": lat[len(lat) // 2] / 1e3, "p99_us": lat[int(len(lat) * 0.99)] / 1e3,
            "msgs_per_s": (n - 1) / ((last_ns - first_ns) / 1e9)}


def cpu_seconds(pids):
    """The user and system CPU time of these processes, all their threads."""
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def message(i):
    return pickle.dumps((time.monotonic_ns(), i, b"x" * PAYLOAD))


def reader_loop(recv, n_lat, n_rate):
    """Receive n_lat spaced messages, then n_rate back to back: the figures."""
    lat = []
    for _ in range(n_lat):
        sent, _, _ = pickle.loads(recv())
        lat.append(time.monotonic_ns() - sent)
    first = None
    for i in range(n_rate):
        recv()
        if i == 0:
            first = time.monotonic_ns()
    return stats(lat, first, time.monotonic_ns(), n_rate)


def writer_loop(send, paced_done=None, rate_start=None):
    """The spaced messages, then those back to back: the writer's own rate
    of these (messages/s), which bounds the reader's."""
    for i in range(LAT_N):
        send(message(i))
        time.sleep(LAT_GAP)
    if paced_done:
        paced_done()
    time.sleep(0.2)
    if rate_start:
        rate_start()
    t0 = time.monotonic_ns()
    for i in range(RATE_N):
        send(message(i))
    return RATE_N / ((time.monotonic_ns() - t0) / 1e9)


def role_zmq_sub(addr):
    import zmq
    s = zmq.Context().socket(zmq.SUB)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.setsockopt(zmq.RCVHWM, 0)
    s.connect(addr)
    print("ready", flush=True)
    print(json.dumps(reader_loop(s.recv, LAT_N, RATE_N)), flush=True)


def role_zmq_pub(addr):
    import zmq
    s = zmq.Context().socket(zmq.PUB)
    s.setsockopt(zmq.SNDHWM, 0)
    s.bind(addr)
    sys.stdin.readline()  # the subscriber is connected
    time.sleep(0.5)       # and subscribed (PUB drops what comes before)
    writer_loop(s.send)
    time.sleep(1)


def role_mq_reader(handle_file, sock, rank="2"):
    from shmbroker import Client, MessageQueue
    with open(handle_file, "rb") as f:
        handle = pickle.load(f)
    mq = MessageQueue.create_from_handle(handle, int(rank), client=Client(sock))
    mq.wait_until_ready(60)
    print("ready", flush=True)
    print(json.dumps(reader_loop(lambda: mq.dequeue(60), LAT_N, RATE_N)), flush=True)
    mq.close()


def stream_counters(a, b, name):
    """The two relays' counters of queue name's stream: A's (out) and B's (in)."""
    out = {}
    for host, direction in ((a, "out"), (b, "in")):
        for q in T.ask(host.relay_sock, {"op": "status"}).get("queues", []):
            if q["queue"] == name and q["direction"] == direction:
                out[direction] = q
    return out


def counters_delta(before, after):
    return {d: {k: v - before.get(d, {}).get(k, 0) for k, v in after[d].items()
                if isinstance(v, int)} for d in after}


def role_mq_drain(handle_file, sock):
    """A local reader of its own process that keeps up until the writer leaves."""
    from shmbroker import Client, MessageQueue
    with open(handle_file, "rb") as f:
        handle = pickle.load(f)
    mq = MessageQueue.create_from_handle(handle, 1, client=Client(sock))
    mq.wait_until_ready(60)
    try:
        while True:
            mq.dequeue(60)
    except Exception:  # noqa: BLE001  (the writer's end)
        pass


def bench_mq(a, b, tmp):
    """The relays' row. LOCAL_READER says where the writer's host's reader
    runs: "thread" (of the writer's process, as the run of record), or
    "process" (its own, as vLLM's local workers), or "none" (every reader
    remote)."""
    from shmbroker import MessageQueue
    n_local = 0 if LOCAL_READER == "none" else 1
    mq = MessageQueue(1 + n_local, n_local, [1] if n_local else [], 1 << 20, 64, T.IP_A,
                      socket_path=a.sock)
    hf = os.path.join(tmp, "handle")
    with open(hf, "wb") as f:
        pickle.dump(mq.export_handle(), f)
    env = dict(os.environ, PYTHONPATH=os.path.join(T.ROOT, "client", "python"))
    local = drainer = None
    if LOCAL_READER == "thread":
        local = MessageQueue.create_from_handle(mq.export_handle(), 1, client=a.client())
    elif LOCAL_READER == "process":
        drainer = subprocess.Popen([sys.executable, __file__, "mq-drain", hf, a.sock], env=env)
    rd = subprocess.Popen([sys.executable, __file__, "mq-reader", hf, b.sock,
                           str(1 + n_local)], stdout=subprocess.PIPE, text=True, env=env)
    import threading
    drained = threading.Event()

    def drain():  # the local reader keeps up, as vLLM's local workers do
        try:
            while True:
                local.dequeue(60)
        except Exception:  # noqa: BLE001  (the writer's end)
            drained.set()

    if local:
        threading.Thread(target=drain, daemon=True).start()
    mq.wait_until_ready(60)
    assert rd.stdout.readline().strip() == "ready"
    # The relays' CPU (both, in % of one CPU): idle with the stream open,
    # then while the spaced messages flow.
    pids = (a.relay_pid(), b.relay_pid())
    t0, c0 = time.monotonic(), cpu_seconds(pids)
    time.sleep(2)
    t1, c1 = time.monotonic(), cpu_seconds(pids)
    marks = []
    c_start = stream_counters(a, b, mq.name)
    w_rate = writer_loop(lambda m: mq.enqueue(m, timeout=60),
                         lambda: marks.append((time.monotonic(), cpu_seconds(pids),
                                               stream_counters(a, b, mq.name))),
                         lambda: marks.append((time.monotonic(), cpu_seconds(pids))))
    out = json.loads(rd.stdout.readline())
    out["writer_msgs_per_s"] = w_rate
    t_end, c_end = time.monotonic(), cpu_seconds(pids)
    out["cpu_idle"] = 100 * (c1 - c0) / (t1 - t0)
    out["cpu_paced"] = 100 * (marks[0][1] - c1) / (marks[0][0] - t1)
    out["cpu_rate"] = 100 * (c_end - marks[1][1]) / (t_end - marks[1][0])
    # CPU time per message (both relays, user and system), in microseconds:
    # a figure the machine's load moves less than the rates.
    out["cpu_us_paced"] = 1e6 * (marks[0][1] - c1) / LAT_N
    out["cpu_us_rate"] = 1e6 * (c_end - marks[1][1]) / RATE_N
    out["paced"] = counters_delta(c_start, marks[0][2])
    out["rate"] = counters_delta(marks[0][2], stream_counters(a, b, mq.name))
    rd.wait(60)
    mq.close()
    if local:
        drained.wait(60)
        local.close()
    if drainer:
        drainer.wait(60)
    return out


def bench_mq_local(a, tmp):
    """The same queue with its one reader on the writer's host, in a process
    of its own: no relay, the Python queue's own floor."""
    from shmbroker import MessageQueue
    mq = MessageQueue(1, 1, [1], 1 << 20, 64, None, socket_path=a.sock)
    hf = os.path.join(tmp, "handle-local")
    with open(hf, "wb") as f:
        pickle.dump(mq.export_handle(), f)
    rd = subprocess.Popen([sys.executable, __file__, "mq-reader", hf, a.sock, "1"],
                          stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=os.path.join(T.ROOT, "client",
                                                                       "python")))
    mq.wait_until_ready(60)
    assert rd.stdout.readline().strip() == "ready"
    w_rate = writer_loop(lambda m: mq.enqueue(m, timeout=60))
    out = json.loads(rd.stdout.readline())
    out["writer_msgs_per_s"] = w_rate
    rd.wait(60)
    mq.close()
    return out


def perftest(test, extra):
    """ucx_perftest TEST from A's namespace to a server in B's, UCX over TCP as
    the relays use it: its Final line's fields, or None."""
    if not shutil.which("ucx_perftest"):
        return None
    env = dict(os.environ, UCX_TLS="tcp")
    port = str(ZMQ_PORT + 1)
    srv = subprocess.Popen(["ip", "netns", "exec", T.NS_B, "ucx_perftest", "-p", port],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        for _ in range(50):  # the server listens within a moment
            time.sleep(0.1)
            r = subprocess.run(["ip", "netns", "exec", T.NS_A, "ucx_perftest", T.IP_B,
                                "-p", port, "-t", test, "-s", str(PAYLOAD + 40)] + extra,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=env, timeout=120)
            for line in r.stdout.splitlines():
                if line.strip().startswith("Final:"):
                    return [float(x) if x != "inf" else 0.0 for x in line.split()[1:]]
            if "refused" not in r.stdout.lower() and "unreachable" not in r.stdout.lower():
                break
        print("ucx_perftest %s gave no figure:\n%s" % (test, r.stdout[-800:]),
              file=sys.stderr)
        return None
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()


def bench_ucx():
    """UCX's floor over the veth: active-message latency one way (ucx_perftest
    halves the round trip; its typical figure stands for the p50) and the
    rate of back-to-back active messages of the pickled message's size."""
    n = str(LAT_N * 5)
    lat = perftest("ucp_am_lat", ["-n", n, "-w", "100"])
    bw = perftest("ucp_am_bw", ["-n", str(RATE_N * 5), "-w", "100"])
    if not lat and not bw:
        return None
    # Final: iterations, latency typical/average/overall (us), bandwidth
    # average/overall (MB/s), message rate average/overall (messages/s).
    return {"p50_us": lat[1] if lat else float("nan"), "p99_us": float("nan"),
            "msgs_per_s": bw[6] if bw else float("nan")}


def bench_zmq():
    addr = "tcp://%s:%d" % (T.IP_A, ZMQ_PORT)
    env = dict(os.environ)
    sub = subprocess.Popen(["ip", "netns", "exec", T.NS_B, sys.executable, __file__,
                            "zmq-sub", addr], stdout=subprocess.PIPE, text=True, env=env)
    pub = subprocess.Popen(["ip", "netns", "exec", T.NS_A, sys.executable, __file__,
                            "zmq-pub", "tcp://*:%d" % ZMQ_PORT], stdin=subprocess.PIPE,
                           text=True, env=env)
    assert sub.stdout.readline().strip() == "ready"
    pub.stdin.write("go\n")
    pub.stdin.flush()
    out = json.loads(sub.stdout.readline())
    sub.wait(60)
    pub.wait(60)
    return out


def describe(c):
    """What the relays' counters say of one phase: messages per message between
    the relays, per hand-off to the writer's relay's loop, per wake-up of the
    readers' relay's thread, and the waits for the window."""
    o, i = c.get("out", {}), c.get("in", {})
    n = o.get("messages", 0)

    def per(k, d):
        return "%.1f" % (n / d[k]) if d.get(k) else "-"
    return ("%d messages; per message between the relays %s (%d sent by A's thread, %d by "
            "its loop with an acknowledgement), per hand-off to A's loop %s, per "
            "acknowledgement %s; A's thread held messages for an acknowledgement %d times, "
            "waited for the window %d times; B's loop published %d, its thread woke %d "
            "times" % (
                n, per("wire_messages", o), o.get("sent_by_thread", 0), o.get("sent_on_ack", 0),
                per("handoffs", o), per("acks", o), o.get("holds", 0),
                o.get("window_waits", 0), i.get("published_by_loop", 0),
                i.get("thread_rounds", 0)))


def main():
    if len(sys.argv) > 1 and not sys.argv[1].startswith("--"):
        {"zmq-sub": role_zmq_sub, "zmq-pub": role_zmq_pub,
         "mq-reader": role_mq_reader, "mq-drain": role_mq_drain}[sys.argv[1]](*sys.argv[2:])
        return
    if os.geteuid() != 0:
        print("SKIP: needs root for ip netns")
        return
    global LOCAL_READER
    rounds = 1
    args = sys.argv[1:]
    while len(args) >= 2 and args[0] in ("--rounds", "--local-reader"):
        if args[0] == "--rounds":
            rounds = int(args[1])
        elif args[1] in ("thread", "process", "none"):
            LOCAL_READER = args[1]
        else:
            sys.exit("--local-reader is thread, process or none, not %r" % args[1])
        args = args[2:]
    if args:
        sys.exit(__doc__)
    tmp = tempfile.mkdtemp(prefix="shmb-qbench-")
    hosts = []
    T.sh("ip", "netns", "add", T.NS_A)
    try:
        T.sh("ip", "netns", "add", T.NS_B)
        T.sh("ip", "link", "add", T.TAG + "va", "type", "veth", "peer", "name", T.TAG + "vb")
        T.sh("ip", "link", "set", T.TAG + "va", "netns", T.NS_A)
        T.sh("ip", "link", "set", T.TAG + "vb", "netns", T.NS_B)
        T.sh("ip", "-n", T.NS_A, "addr", "add", T.IP_A + "/24", "dev", T.TAG + "va")
        T.sh("ip", "-n", T.NS_B, "addr", "add", T.IP_B + "/24", "dev", T.TAG + "vb")
        for ns, dev in ((T.NS_A, T.TAG + "va"), (T.NS_B, T.TAG + "vb")):
            T.sh("ip", "-n", ns, "link", "set", dev, "up")
            T.sh("ip", "-n", ns, "link", "set", "lo", "up")
        key = os.path.join(tmp, "key")
        with open(key, "w") as f:
            f.write(os.urandom(32).hex())
        os.chmod(key, 0o600)
        a = T.Host(tmp, "A", T.NS_A, T.IP_A, "B", T.IP_B, key)
        hosts.append(a)
        b = T.Host(tmp, "B", T.NS_B, T.IP_B, "A", T.IP_A, key)
        hosts.append(b)
        T.wait_for("the relays to connect", lambda: a.connected() and b.connected())
        rows = []
        for i in range(rounds):
            # Interleaved, so that the machine's load weighs on every row alike.
            rows.append(("MessageQueue through the relays", bench_mq(a, b, tmp)))
            rows.append(("ZeroMQ PUB/SUB over TCP", bench_zmq()))
            rows.append(("MessageQueue, reader on the writer's host (no relay)",
                         bench_mq_local(a, tmp)))
            ucx = bench_ucx()
            if ucx:
                rows.append(("UCX active messages over TCP (ucx_perftest)", ucx))
        load = os.getloadavg()[0]
        print("Remote queue, %d-byte pickled messages, writer in one namespace, reader in "
              "the other, the writer's host's reader: %s (load %.1f, %d round%s):" % (
                  PAYLOAD, LOCAL_READER, load, rounds, "s" if rounds > 1 else ""))
        print("| path | one-way p50 (us) | p99 (us) | messages/s |")
        print("|---|---|---|---|")
        for name, r in rows:
            print("| %s | %.0f | %s | %.0f |" % (
                name, r["p50_us"], "-" if r["p99_us"] != r["p99_us"] else
                "%.0f" % r["p99_us"], r["msgs_per_s"]))
        for name, r in rows:
            if "writer_msgs_per_s" in r:
                print("%s: the writer enqueued %.0f messages/s back to back" % (
                    name, r["writer_msgs_per_s"]))
        for _, r in rows:
            if "cpu_idle" in r:
                print("The two relays' CPU: %.1f %% idle with the stream open, %.1f %% while "
                      "messages came 1 ms apart (%.0f us a message), %.1f %% while they came "
                      "back to back (%.1f us a message) (of one CPU)" % (
                          r["cpu_idle"], r["cpu_paced"], r["cpu_us_paced"], r["cpu_rate"],
                          r["cpu_us_rate"]))
                for phase in ("paced", "rate"):
                    print("  %s: %s" % (phase, describe(r[phase])))
    finally:
        for h in hosts:
            h.stop()
        for ns in (T.NS_A, T.NS_B):
            T.sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
