# SPDX-License-Identifier: Apache-2.0
"""A fixed request workload for counting the daemon's instructions.

Connects to SOCKET, says hello, then runs N objects through the plain path
(alloc, commit, get and a noreply release, each answer awaited), N objects
through batches of 16 (three batch lines and 16 noreply releases per 16
objects) and 50 stats, and prints how many requests it sent. The same
requests in the same order every run: the daemon's instruction count for it
does not depend on the machine's load, unlike a timing. Standard library only.

    python3 tests/bench/workload.py SOCKET [N]
"""
import socket
import sys
import time


def main():
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    s = socket.socket(socket.AF_UNIX)
    for _ in range(400):
        try:
            s.connect(path)
            break
        except OSError:
            time.sleep(0.05)
    replies = s.makefile("rb")
    sent = 0

    def call(line):
        nonlocal sent
        s.sendall(line + b"\n")
        sent += 1
        reply = replies.readline()
        if b'"ok":true' not in reply:
            raise SystemExit("unexpected reply: %r" % reply)

    def send(lines):
        nonlocal sent
        s.sendall(b"".join(line + b"\n" for line in lines))
        sent += len(lines)

    call(b'{"op":"hello","version":1,"id":0}')
    rid = 1
    for k in range(n):
        key = b'"p%d"' % k
        call(b'{"op":"alloc","key":%s,"size":64,"id":%d}' % (key, rid))
        call(b'{"op":"commit","key":%s,"id":%d}' % (key, rid + 1))
        call(b'{"op":"get","key":%s,"id":%d}' % (key, rid + 2))
        send([b'{"op":"release","key":%s,"noreply":true}' % key])
        rid += 3
    for b in range(n // 16):
        keys = [b'"b%d_%d"' % (b, j) for j in range(16)]
        for op, extra in ((b"alloc", b',"size":64'), (b"commit", b""), (b"get", b"")):
            ops = b",".join(b'{"op":"%s","key":%s%s,"id":%d}' % (op, k, extra, j)
                            for j, k in enumerate(keys))
            call(b'{"op":"batch","ops":[%s],"id":%d}' % (ops, rid))
            rid += 1
        send([b'{"op":"release","key":%s,"noreply":true}' % k for k in keys])
    for _ in range(50):
        call(b'{"op":"stats","id":%d}' % rid)
        rid += 1
    s.close()
    print(sent)


main()
