# SPDX-License-Identifier: Apache-2.0
"""The protocol cases kept as data (tests/protocol/*.case, format in
tests/protocol/README), run from Python over raw lines: each file is one
test, against a fresh daemon, with the same matching rules as
tests/e2e/test_cases.c."""

import glob
import json
import os
import select
import socket
import time
import unittest

import support

CASES = sorted(glob.glob(os.path.join(support.ROOT, "tests", "protocol", "*.case")))
REPLY_TIMEOUT = 5.0
QUIET_S = 0.3


class CaseFailure(AssertionError):
    pass


class RawConn:
    """One connection: lines out, lines in; descriptors received are closed."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""

    def send(self, data):
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _recv(self, timeout):
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return None
        data, fds, _, _ = socket.recv_fds(self.sock, 65536, 8)
        for fd in fds:
            os.close(fd)
        return data

    def line(self, timeout):
        """The next line; None on timeout, b"" at EOF."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                data = self._recv(left)
            except ConnectionResetError:
                data = b""
            if data is None:
                return None
            if not data:
                return b""
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def close(self):
        self.sock.close()


def glob_match(pattern, text):
    if "<*>" not in pattern:
        return pattern == text
    head, rest = pattern.split("<*>", 1)
    if not text.startswith(head):
        return False
    text = text[len(head):]
    return any(glob_match(rest, text[i:]) for i in range(len(text) + 1))


class CaseRun:
    def __init__(self, path):
        self.path = path
        self.name = os.path.basename(path)
        self.lineno = 0
        self.size = "1M"
        self.args = []
        self.daemon = None
        self.conns = {}
        self.cur = None
        self.caps = {}

    def fail(self, why):
        raise CaseFailure("%s:%d: %s" % (self.name, self.lineno, why))

    def match(self, want, got, path):
        if isinstance(want, str):
            if want == "<any>":
                return
            if want == "<int>":
                if type(got) is not int:
                    self.fail("%s: an integer expected" % path)
                return
            if want == "<bool>":
                if type(got) is not bool:
                    self.fail("%s: a boolean expected" % path)
                return
            if want == "<str>":
                if not isinstance(got, str):
                    self.fail("%s: a string expected" % path)
                return
            if len(want) > 3 and want.startswith("<$") and want.endswith(">"):
                if want in self.caps:
                    if not same(self.caps[want], got):
                        self.fail("%s: not the value captured as %s" % (path, want))
                else:
                    self.caps[want] = got
                return
            if not isinstance(got, str) or not glob_match(want, got):
                self.fail("%s: expected %r, got %r" % (path, want, got))
            return
        if isinstance(want, dict):
            if not isinstance(got, dict):
                self.fail("%s: an object expected" % path)
            for k in got:
                if k not in want:
                    self.fail("%s: unexpected field %r" % (path, k))
            for k, v in want.items():
                if k not in got:
                    self.fail("%s.%s: missing" % (path, k))
                self.match(v, got[k], "%s.%s" % (path, k))
            return
        if isinstance(want, list):
            if not isinstance(got, list) or len(got) != len(want):
                self.fail("%s: an array of %d expected" % (path, len(want)))
            for i, (w, g) in enumerate(zip(want, got)):
                self.match(w, g, "%s[%d]" % (path, i))
            return
        if not same(want, got):
            self.fail("%s: values differ (%r, %r)" % (path, want, got))

    def ensure_daemon(self):
        if self.daemon is None:
            # In /dev/shm itself, as tests/e2e/test_cases.c: stats.case
            # expects that shm_dir.
            self.daemon = support.Daemon(self.size, self.args, shm_dir="/dev/shm").start()

    def connect(self, name):
        self.ensure_daemon()
        if name in self.conns:
            self.fail("connection %s is already open" % name)
        self.conns[name] = self.cur = RawConn(self.daemon.socket_path)

    def need_conn(self):
        if self.cur is None:
            self.connect("main")

    def directive(self, text):
        word, _, arg = text.partition(" ")
        arg = arg.strip()
        if word == "daemon":
            if self.daemon is not None:
                self.fail('"! daemon" comes before the first request')
            toks = arg.split()
            while toks:
                t = toks.pop(0)
                if t == "--size":
                    self.size = toks.pop(0)
                else:
                    self.args.append(t)
            return
        if word == "connect":
            return self.connect(arg or "main")
        if word == "use":
            if arg not in self.conns:
                self.fail("no open connection %s" % arg)
            self.cur = self.conns[arg]
            return
        if word == "sleep":
            time.sleep(int(arg) / 1000.0)
            return
        self.need_conn()
        if word == "quiet":
            line = self.cur.line(QUIET_S)
            if line is not None:
                self.fail("a reply where none was expected: %r" % line if line else
                          "the connection ended")
        elif word == "eof":
            line = self.cur.line(REPLY_TIMEOUT)
            if line != b"":
                self.fail("the daemon did not close the connection (%r)" % line)
        elif word == "close":
            self.cur.close()
            self.conns = {k: v for k, v in self.conns.items() if v is not self.cur}
            self.cur = None
        elif word == "oversize":
            self.cur.send(b"x" * int(arg))
        else:
            self.fail("unknown directive %r" % word)

    def run(self):
        with open(self.path, "rb") as f:
            lines = f.read().split(b"\n")
        try:
            for raw in lines:
                self.lineno += 1
                raw = raw.rstrip(b"\r")
                if not raw or raw.startswith(b"#"):
                    continue
                if len(raw) < 2 or raw[1:2] != b" ":
                    self.fail('a line starts with "> ", "< ", "! " or "#"')
                kind, body = raw[:1], raw[2:]
                if kind == b"!":
                    self.directive(body.decode())
                    continue
                self.need_conn()
                if kind == b">":
                    if not self.cur.send(body + b"\n"):
                        self.fail("send failed")
                elif kind == b"<":
                    want = json.loads(body)
                    line = self.cur.line(REPLY_TIMEOUT)
                    if not line:
                        self.fail("no reply" if line is None else "the connection ended")
                    try:
                        got = json.loads(line)
                    except ValueError:
                        self.fail("the reply is not JSON: %r" % line)
                    try:
                        self.match(want, got, "reply")
                    except CaseFailure as e:
                        raise CaseFailure("%s\n    expected: %s\n    got:      %s"
                                          % (e, body.decode("utf-8", "replace"),
                                             line.decode("utf-8", "replace"))) from None
                else:
                    self.fail('a line starts with "> ", "< ", "! " or "#"')
        finally:
            for c in self.conns.values():
                c.close()
            if self.daemon is not None:
                self.daemon.cleanup()


def same(a, b):
    """JSON equality that tells integers from booleans and reals."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


class TestCases(unittest.TestCase):
    """One test per case file, added below."""

    def test_there_are_cases(self):
        self.assertGreaterEqual(len(CASES), 13)


def _make(path):
    def test(self):
        CaseRun(path).run()
    test.__doc__ = "tests/protocol/%s through the Python runner" % os.path.basename(path)
    return test


for _path in CASES:
    setattr(TestCases, "test_" + os.path.basename(_path)[:-5], _make(_path))
