#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The relay's bench table: fetch bandwidth of 1, 16 and 256 MiB objects
between two network namespaces joined by a veth pair (UCX over TCP), against
ucx_perftest's ucp_get over the same link (the UCX floor) and a Redis GET of
the same bytes across the namespaces, and a plain TCP socket across the
same link (its ceiling). Needs root, ip netns, ucx-utils,
redis-server and python3-redis (make bench-relay installs them).
BENCH_QUICK=1 for one round of each."""

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("relay_run", os.path.join(HERE, "test_relay.py"))
R = importlib.util.module_from_spec(spec)
spec.loader.exec_module(R)

SIZES = [1 << 20, 16 << 20, 256 << 20]
ROUNDS = 1 if os.environ.get("BENCH_QUICK") else 5
MiB = 1 << 20


def mbps(size, seconds):
    return size / seconds / 1e6


def relay_fetch(a, b, size):
    """Best and median MB/s of ROUNDS fetches of one size-byte object."""
    R.put_random(b, "bench", size)
    rates = []
    with a.client() as c:
        for _ in range(ROUNDS):
            try:
                c.delete("bench")
            except R.errors.NotFound:
                pass
            t0 = time.perf_counter()
            c.fetch("B", "bench")
            rates.append(mbps(size, time.perf_counter() - t0))
        c.delete("bench")
    with b.client() as c:
        c.delete("bench")
    rates.sort()
    return rates[-1], rates[len(rates) // 2]


def perftest(size):
    """ucx_perftest ucp_get of size bytes from B's namespace to A's: MB/s."""
    env = dict(os.environ, UCX_TLS="tcp")
    port = "13390"
    srv = subprocess.Popen(["ip", "netns", "exec", R.NS_B, "ucx_perftest", "-p", port],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        time.sleep(0.5)
        iters = max(4, (64 * MiB) // size) if not os.environ.get("BENCH_QUICK") else 4
        r = subprocess.run(["ip", "netns", "exec", R.NS_A, "ucx_perftest", R.IP_B, "-p", port,
                            "-t", "ucp_get", "-s", str(size), "-n", str(iters), "-w", "2"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, timeout=300)
        for line in r.stdout.splitlines():
            if line.strip().startswith("Final:"):
                # Final: iterations, latency p50/average/overall (us),
                # bandwidth average/overall (MB/s, 2^20), message rate; an
                # average may read "inf".
                return float(line.split()[6]) * MiB / 1e6
        print("ucx_perftest gave no figure:\n" + r.stdout[-1500:], file=sys.stderr)
        return None
    finally:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()


def redis_get(size):
    """A Redis GET of size bytes, server in B's namespace, client in A's: best MB/s."""
    port = "6391"
    srv = subprocess.Popen(["ip", "netns", "exec", R.NS_B, "redis-server", "--port", port,
                            "--bind", R.IP_B, "--save", "", "--appendonly", "no",
                            "--protected-mode", "no"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    code = ("import redis, os, time, sys\n"
            "r = redis.Redis(host=%r, port=%s)\n"
            "for i in range(100):\n"
            "    try:\n        r.ping(); break\n"
            "    except redis.ConnectionError: time.sleep(0.05)\n"
            "r.set('bench', os.urandom(%d))\n"
            "best = 0\n"
            "for i in range(%d):\n"
            "    t0 = time.perf_counter(); v = r.get('bench'); dt = time.perf_counter() - t0\n"
            "    assert len(v) == %d\n"
            "    best = max(best, len(v) / dt / 1e6)\n"
            "print(best)\n") % (R.IP_B, port, size, ROUNDS, size)
    try:
        r = subprocess.run(["ip", "netns", "exec", R.NS_A, "/usr/bin/python3", "-c", code],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=300)
        if r.returncode != 0:
            print("redis GET failed: " + r.stderr[-800:], file=sys.stderr)
            return None
        return float(r.stdout.strip())
    finally:
        srv.send_signal(signal.SIGTERM)
        srv.wait(10)


# A plain TCP socket across the same veth: B serves size bytes from a warm
# buffer for each one-byte request, A receives them into a warm buffer with
# recv_into. What the link itself carries, with one request per object as
# a fetch has: no protocol, no pool, no copy but the kernel's.
TCP_SERVER = """
import socket, sys
size = int(sys.argv[2])
buf = memoryview(bytearray(b"x" * size))
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[3])))
srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
while conn.recv(1):
    conn.sendall(buf)
"""

TCP_CLIENT = """
import socket, sys, time
size = int(sys.argv[2])
buf = memoryview(bytearray(size))
for i in range(100):
    try:
        s = socket.create_connection((sys.argv[1], int(sys.argv[3])))
        break
    except OSError:
        time.sleep(0.05)
best = 0
for i in range(int(sys.argv[4]) + 1):
    t0 = time.perf_counter()
    s.sendall(b"g")
    got = 0
    while got < size:
        n = s.recv_into(buf[got:])
        if not n:
            sys.exit("the server closed after %d of %d bytes" % (got, size))
        got += n
    dt = time.perf_counter() - t0
    if i:  # the first lap warms both buffers' pages
        best = max(best, size / dt / 1e6)
print(best)
"""


def tcp_plain(size):
    """One plain TCP socket from B's namespace to A's: best MB/s of ROUNDS
    requests of size bytes (the link's own ceiling for a fetch)."""
    port = "13391"
    srv = subprocess.Popen(["ip", "netns", "exec", R.NS_B, "/usr/bin/python3", "-c",
                            TCP_SERVER, R.IP_B, str(size), port],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        srv.stdout.readline()
        r = subprocess.run(["ip", "netns", "exec", R.NS_A, "/usr/bin/python3", "-c",
                            TCP_CLIENT, R.IP_B, str(size), port, str(ROUNDS)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=300)
        if r.returncode != 0:
            print("plain TCP failed: " + r.stderr[-800:], file=sys.stderr)
            return None
        return float(r.stdout.strip())
    finally:
        srv.kill()
        srv.wait(10)


def main():
    if os.geteuid() != 0:
        sys.exit("bench-relay: needs root for ip netns")
    for tool in ("ucx_perftest", "redis-server"):
        if not shutil.which(tool):
            sys.exit("bench-relay: %s is missing (scripts/install-deps.sh bench)" % tool)
    tmp = tempfile.mkdtemp(prefix="shmb-relay-bench-")
    hosts = []
    try:
        R.sh("ip", "netns", "add", R.NS_A)
        key = R.make_link(tmp)
        big = ["--max-object-size", "300M"]
        a = R.Host(tmp, "A", R.NS_A, R.IP_A, "B", R.IP_B, key, "768M", big)
        hosts.append(a)
        b = R.Host(tmp, "B", R.NS_B, R.IP_B, "A", R.IP_A, key, "768M", big)
        hosts.append(b)
        R.wait_for("the relays to connect", lambda: a.connected() and b.connected())
        print("Relay fetch between two namespaces over a veth pair, UCX_TLS=tcp, "
              "%d round(s); MB/s (10^6 bytes/s)" % ROUNDS)
        print("%-8s %12s %12s %14s %12s %10s %10s %10s" % (
            "size", "fetch best", "fetch p50", "ucx_perftest", "redis GET", "plain TCP",
            "vs UCX", "vs Redis"))
        for size in SIZES:
            best, p50 = relay_fetch(a, b, size)
            floor = perftest(size)
            red = redis_get(size)
            tcp = tcp_plain(size)
            print("%-8s %12.0f %12.0f %14s %12s %10s %10s %10s" % (
                "%d MiB" % (size // MiB), best, p50,
                "%.0f" % floor if floor else "-", "%.0f" % red if red else "-",
                "%.0f" % tcp if tcp else "-",
                "%.0f %%" % (100 * best / floor) if floor else "-",
                "%.1fx" % (best / red) if red else "-"), flush=True)
        print("targets: >= 80 % of the UCX floor at 16 MiB, >= 5x Redis; plain TCP: "
              "one socket across the same link, best of the same rounds (the link's ceiling)")
    finally:
        for h in hosts:
            h.stop()
        for ns in (R.NS_A, R.NS_B):
            R.sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
