# SPDX-License-Identifier: Apache-2.0
"""The package's hand-written tables (shmbroker/_protocol.py) against proto/'s
single sources: ops.def, errors.def, stats.def, protocol.h, layout.h and
names.h (with the queue module's name check and overflow key). Any difference
fails, so the Python client never drifts from the daemon."""

import os
import re
import struct
import types
import unittest

import support
from shmbroker import _protocol as P
from shmbroker import errors
from shmbroker import _arena

PROTO = os.path.join(support.ROOT, "proto")


def read(name):
    with open(os.path.join(PROTO, name), encoding="utf-8") as f:
        return f.read()


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def define(text, name):
    m = re.search(r"^#define\s+%s\s+(.+?)\s*(?:/\*.*)?$" % name, text, re.M)
    if m is None:
        raise AssertionError("no #define %s" % name)
    return m.group(1)


def c_int(expr):
    """The value of a simple C constant expression (UINT64_C(...), 4096u,
    (64 * 1024))."""
    expr = re.sub(r"U?INT\d+_C\(([^)]*)\)", r"\1", expr)
    expr = re.sub(r"\b(0x[0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", expr)
    if not re.fullmatch(r"[0-9a-fA-Fx()*+ \t-]+", expr):
        raise AssertionError("not a constant: %r" % expr)
    return eval(expr)  # digits, parentheses and arithmetic only, checked above


class TestTables(unittest.TestCase):
    def test_ops_and_flags(self):
        """ops.def's rows, in order, with their flags, are _protocol.OPS."""
        proto_h = read("protocol.h")
        flagval = {m.group(1): int(m.group(2)) for m in
                   re.finditer(r"(SHMB_OPF_\w+)\s*=\s*(\d+)", proto_h)}
        self.assertEqual(flagval, {"SHMB_OPF_WRITES": P.OPF_WRITES,
                                   "SHMB_OPF_NOREPLY": P.OPF_NOREPLY,
                                   "SHMB_OPF_BATCH": P.OPF_BATCH})
        rows = re.findall(r"^SHMB_OP\(\s*(\w+)\s*,\s*(\w+)\s*,\s*([^,]+),",
                          strip_comments(read("ops.def")), re.M)
        self.assertTrue(rows)
        got = []
        for op_id, name, flags in rows:
            self.assertEqual(op_id, name.upper())
            value = 0
            for f in flags.split("|"):
                f = f.strip()
                value |= int(f) if f.isdigit() else flagval[f]
            got.append((name, value))
        self.assertEqual(got, list(P.OPS.items()))

    def test_error_codes(self):
        """errors.def's wire and library codes are _protocol's, and every wire
        code has the class the contract names."""
        rows = re.findall(r"^SHMB_ERR\(\s*(\w+)\s*,\s*(\w+)\s*\)",
                          strip_comments(read("errors.def")), re.M)
        wire = tuple(n for n, w in rows if w == "SHMB_ERR_WIRE")
        lib = tuple(n for n, w in rows if w == "SHMB_ERR_LIBRARY")
        self.assertEqual(len(wire) + len(lib), len(rows))
        self.assertEqual(wire, P.WIRE_ERRORS)
        self.assertEqual(lib, P.LIBRARY_ERRORS)
        for code in wire + lib:
            self.assertIsInstance(errors.error_for(code, "m"), errors.ShmBrokerError)

    def test_stats_fields(self):
        """stats.def's fields, in order, split into the top level and the
        counters, are _protocol's."""
        rows = re.findall(r"^SHMB_STAT\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)",
                          strip_comments(read("stats.def")), re.M)
        top = tuple(n for _, n, k in rows if k != "SHMB_STATK_COUNTER")
        counters = tuple(n for _, n, k in rows if k == "SHMB_STATK_COUNTER")
        self.assertEqual(top, P.STATS_FIELDS)
        self.assertEqual(counters, P.STATS_COUNTERS)

    def test_protocol_constants(self):
        """protocol.h's limits and defaults."""
        h = read("protocol.h")
        self.assertEqual(c_int(define(h, "SHMB_PROTOCOL_VERSION")), P.PROTOCOL_VERSION)
        self.assertEqual(c_int(define(h, "SHMB_MAX_LINE")), P.MAX_LINE)
        self.assertEqual(c_int(define(h, "SHMB_MAX_REPLY")), P.MAX_REPLY)
        self.assertEqual(c_int(define(h, "SHMB_MAX_BATCH")), P.MAX_BATCH)
        self.assertEqual(define(h, "SHMB_DEFAULT_SOCKET"), '"%s"' % P.DEFAULT_SOCKET)
        self.assertEqual(define(h, "SHMB_SOCKET_ENV"), '"%s"' % P.SOCKET_ENV)
        self.assertEqual(define(h, "SHMB_USER_SOCKET_DIR"), '"%s"' % P.USER_SOCKET_DIR)
        self.assertEqual(define(h, "SHMB_USER_SOCKET_TMP"), '"%s"' % P.USER_SOCKET_TMP)
        self.assertEqual(define(h, "SHMB_USER_SOCKET_NAME"), '"%s"' % P.USER_SOCKET_NAME)
        self.assertEqual(c_int(define(h, "SHMB_DEFAULT_MAX_PENDING")), P.PUT_CHUNK)
        # The daemon's default and the library's chunk are that one number.
        with open(os.path.join(support.ROOT, "client", "many.c"), encoding="utf-8") as f:
            self.assertEqual(define(f.read(), "CLIENT_PUT_CHUNK"), "SHMB_DEFAULT_MAX_PENDING")
        with open(os.path.join(support.ROOT, "daemon", "config.h"), encoding="utf-8") as f:
            self.assertEqual(define(f.read(), "CONFIG_DEFAULT_MAX_PENDING"),
                             "SHMB_DEFAULT_MAX_PENDING")

    def test_names(self):
        """proto/names.h's rules are the package's: the limits, the
        characters (names.c's) and the overflow key's prefix; and the queue
        module's name check and overflow key, written by hand, agree with
        that rule on its edges."""
        h = read("names.h")
        self.assertEqual(c_int(define(h, "SHMB_POOL_NAME_MAX")), P.POOL_NAME_MAX)
        self.assertEqual(define(h, "SHMB_QUEUE_NAME_LEN_MAX"), "SHMB_POOL_NAME_MAX")
        self.assertEqual(P.QUEUE_NAME_MAX, P.POOL_NAME_MAX)
        self.assertEqual(define(h, "SHMB_QUEUE_KEY_PREFIX"), '"%s"' % P.QUEUE_KEY_PREFIX)
        c = strip_comments(read("names.c"))
        body = c[c.index("bool shmb_name_ok("):c.index("int shmb_q_name_check(")]
        chars = set(re.findall(r"ch == '(.)'", body))
        for lo, hi in re.findall(r"ch >= '(.)' && ch <= '(.)'", body):
            chars |= {chr(i) for i in range(ord(lo), ord(hi) + 1)}
        self.assertEqual(chars, P.NAME_CHARS)

        from shmbroker import queue
        top = P.QUEUE_NAME_MAX
        for name in ("a-b_C9", "x" * top, "x" * (top + 1), "", "a b", "a/b", "a.b",
                     "\u00e9t\u00e9", "a\x00b", "ab\udcff", "Z" * (top - 1) + "\u00e9"):
            raw = name.encode("utf-8", "surrogatepass")
            want = 1 <= len(raw) <= P.QUEUE_NAME_MAX and set(name) <= P.NAME_CHARS
            try:
                queue._check_name(name)
                got = True
            except errors.InvalidRequest:
                got = False
            self.assertEqual(got, want, "queue name %r" % name)
        key = queue.MessageQueue._object_key(types.SimpleNamespace(name="steps"), 2 ** 64 - 1)
        self.assertEqual(key, P.QUEUE_KEY_PREFIX + "steps/18446744073709551615")

    def test_layout_constants(self):
        """layout.h's magic numbers, sizes and chunk states."""
        h = read("layout.h")
        self.assertEqual(c_int(define(h, "SHMB_SEGMENT_MAGIC")), P.SEGMENT_MAGIC)
        self.assertEqual(c_int(define(h, "SHMB_LAYOUT_VERSION")), P.LAYOUT_VERSION)
        self.assertEqual(c_int(define(h, "SHMB_HEADER_PAGE")), P.HEADER_PAGE)
        self.assertEqual(c_int(define(h, "SHMB_ALIGN")), P.ALIGN)
        self.assertEqual(c_int(define(h, "SHMB_KEY_MAX")), P.KEY_MAX)
        self.assertEqual(c_int(define(h, "SHMB_CHUNK_MAGIC")), P.CHUNK_MAGIC)
        states = dict(re.findall(r"SHMB_CHUNK_(\w+)\s*=\s*(\d+)", h))
        self.assertEqual({k: int(v) for k, v in states.items()},
                         {"GAP": P.CHUNK_GAP, "PENDING": P.CHUNK_PENDING,
                          "COMMITTED": P.CHUNK_COMMITTED, "FREE": P.CHUNK_FREE,
                          "ARENA": P.CHUNK_ARENA, "WRITTEN": P.CHUNK_WRITTEN})
        self.assertEqual(c_int(define(h, "SHMB_ARENA_INFLIGHT_AT")), _arena.INFLIGHT_AT)
        self.assertEqual(c_int(define(h, "SHMB_ARENA_PUBLISHED_AT")), _arena.PUBLISHED_AT)
        self.assertEqual(define(h, "SHMB_ARENA_PUBLISH_CLOSED"), "UINT64_MAX")
        self.assertEqual(_arena.PUBLISH_CLOSED, 2 ** 64 - 1)
        self.assertEqual(c_int(define(h, "SHMB_COUNTERS_AT")), P.COUNTERS_AT)
        self.assertEqual(c_int(define(h, "SHMB_SEGMENT_RETIRED")), P.SEGMENT_RETIRED)
        self.assertEqual(dict(P.SEGMENT_HEADER_FIELDS)["retired"], P.SEGMENT_RETIRED_AT)
        self.assertEqual(c_int(define(h, "SHMB_CATALOG_AWAITED")), P.CATALOG_AWAITED)
        self.assertEqual(c_int(define(h, "SHMB_CATALOG_PROBES")), P.CATALOG_PROBES)

    def check_struct(self, cname, fmt, fields, size):
        """A struct of layout.h: its members' types, the _Static_assert'ed
        offsets and size, against the struct format and field table."""
        h = strip_comments(read("layout.h"))
        body = re.search(r"struct %s \{(.*?)\};" % cname, h, re.S).group(1)
        members = [(t, n.strip()) for t, names in re.findall(r"(u?int\d+)_t\s+([\w\s,]+);", body)
                   for n in names.split(",")]
        codes = {"uint64": "Q", "int64": "q", "uint32": "I", "uint16": "H"}
        self.assertEqual([n for _, n in members], [n for n, _ in fields])
        self.assertEqual("=" + "".join(codes[t] for t, _ in members), fmt.format)
        asserted = dict((f, int(o)) for f, o in re.findall(
            r"SHMB_LAYOUT_AT\(struct %s,\s*(\w+),\s*(\d+)\)" % cname, h))
        # Padding (reserved2) may go without an assert of its own.
        self.assertEqual(asserted, {n: o for n, o in fields
                                    if n in asserted or not n.startswith("reserved")})
        declared = int(re.search(r"sizeof\(struct %s\) == (\d+)" % cname, h).group(1))
        self.assertEqual(declared, size)
        self.assertEqual(fmt.size, size)
        for i, (name, off) in enumerate(fields):
            self.assertEqual(struct.calcsize(fmt.format[:i + 1]), off, name)

    def test_segment_header(self):
        self.check_struct("shmb_segment_header", P.SEGMENT_HEADER, P.SEGMENT_HEADER_FIELDS,
                          P.SEGMENT_HEADER_SIZE)

    def test_chunk_header(self):
        self.check_struct("shmb_chunk_header", P.CHUNK_HEADER, P.CHUNK_HEADER_FIELDS,
                          P.CHUNK_HEADER_SIZE)

    def test_catalog_entry(self):
        self.check_struct("shmb_catalog_entry", P.CATALOG_ENTRY, P.CATALOG_ENTRY_FIELDS,
                          P.CATALOG_ENTRY_SIZE)

    def test_published_counters(self):
        self.check_struct("shmb_published_counters", P.PUBLISHED_COUNTERS,
                          P.PUBLISHED_COUNTERS_FIELDS, P.PUBLISHED_COUNTERS_SIZE)

    def test_version(self):
        """The package's version is the C project's (Makefile VERSION)."""
        import shmbroker
        with open(os.path.join(support.ROOT, "Makefile"), encoding="utf-8") as f:
            version = re.search(r"^VERSION\s*:?=\s*(\S+)", f.read(), re.M).group(1)
        self.assertEqual(shmbroker.__version__, version)
        with open(os.path.join(support.PACKAGE_DIR, "pyproject.toml"), encoding="utf-8") as f:
            self.assertIn('version = "%s"' % version, f.read())
