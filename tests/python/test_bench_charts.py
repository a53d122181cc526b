# SPDX-License-Identifier: Apache-2.0
"""scripts/bench_charts.py draws each chart from the JSON lines a run wrote:
a chart's curves are the peers and figures in those lines, a chart whose
figures are missing is left out, and no figures at all is an error."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHARTS = os.path.join(ROOT, "scripts", "bench_charts.py")


def obj(mode, label, size, clients, ops):
    return {"mode": mode, "label": label, "size": size, "clients": clients,
            "ops_per_s": ops, "gb_per_s": ops * size / 1e9}


def queue(impl, run, size, readers, **kw):
    row = {"mode": "queue", "impl": impl, "run": run, "size": size, "readers": readers,
           "msgs": 1000, "seconds": 1.0, "msgs_per_s": 5000.0, "p50_us": 10.0, "p99_us": 30.0,
           "p999_us": 90.0, "period_us": 200, "cpu_s_per_reader": 0.1, "spin_us": 0}
    row.update(kw)
    return row


class ChartsTest(unittest.TestCase):
    def setUp(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib is missing (sh scripts/install-deps.sh test)")
        self.tmp = tempfile.mkdtemp(prefix="shmb-charts-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.out = os.path.join(self.tmp, "charts")

    def write(self, name, rows):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write("not a JSON line, as bench.sh's files may hold\n")
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return path

    def draw(self, *args):
        return subprocess.run([sys.executable, CHARTS, self.out] + list(args),
                              capture_output=True, text=True, timeout=120)

    def svg(self, name):
        with open(os.path.join(self.out, name)) as f:
            return f.read()

    # The objects chart has a curve per peer in the run, and only those; the
    # queue charts are drawn from the queue lines; vllm.svg is left out when
    # no vLLM figures were given.
    def test_curves_are_the_runs_peers(self):
        rows = []
        for size in (64, 4096, 1048576):
            for n in (1, 16):
                rows += [obj("putread", "new-%d-%d" % (size, n), size, n, 1e5),
                         obj("redis", "%d-%d" % (size, n), size, n, 5e4),
                         obj("memcpy", "%d-%d" % (size, n), size, n, 1e6)]
        for impl in ("shmb", "zmq"):
            for size in (64, 4096):
                for n in (1, 4):
                    rows += [queue(impl, "latency", size, n), queue(impl, "throughput", size, n)]
            # An idle run has sent nothing: its seconds are 0, as shmb-queue-bench reports.
            rows.append(queue(impl, "idle", 64, 1, cpu_s_per_reader=0.001, seconds=0.0))
        r = self.draw("--results", self.write("results.json", rows))
        self.assertEqual(r.returncode, 0, r.stderr)
        objects = self.svg("objects-throughput.svg")
        self.assertIn("shmbroker put+read", objects)
        self.assertIn("Redis SET+GET", objects)
        self.assertIn("memcpy", objects)
        self.assertNotIn("shmbroker put+get", objects)  # no putget lines in this run
        for name in ("queue-throughput.svg", "queue-latency.svg", "queue-cpu.svg"):
            text = self.svg(name)
            self.assertIn("zmq", text, name)
            self.assertIn("shmb", text, name)
        self.assertFalse(os.path.exists(os.path.join(self.out, "vllm.svg")))
        self.assertIn("chart: %s" % os.path.join(self.out, "objects-throughput.svg"), r.stdout)

    # The vLLM chart has a bar per measure, labelled with the measure, and
    # leaves out the first laps; a lower-is-better ratio is drawn inverted.
    def test_vllm_chart(self):
        rows = [{"mode": "vllm", "key": "store 64 KiB", "vllm": 100.0, "ours": 300.0,
                 "ratio": 3.0, "lo": 2.0, "hi": 4.0, "higher_is_better": True},
                {"mode": "vllm", "key": "queue p50:64 B x1 every 200 us", "vllm": 10.0,
                 "ours": 20.0, "ratio": 2.0, "lo": 1.5, "hi": 2.5, "higher_is_better": False},
                {"mode": "vllm", "key": "store first:64 KiB", "vllm": 1.0, "ours": 2.0,
                 "ratio": 2.0, "lo": 2.0, "hi": 2.0, "higher_is_better": True}]
        r = self.draw("--vllm", self.write("vllm.json", rows))
        self.assertEqual(r.returncode, 0, r.stderr)
        text = self.svg("vllm.svg")
        self.assertIn("store 64 KiB", text)
        self.assertIn("queue p50:64 B x1 every 200 us", text)
        self.assertNotIn("first:", text)
        # Two bars: one right of 1 (3x better), one left (half as good).
        bars = re.findall(r'<g id="patch_\d+">', text)
        self.assertGreaterEqual(len(bars), 3)  # the axes' background and the two bars

    # Bytes that are not UTF-8 and a row without the fields its chart needs:
    # that chart is left out with a message, the others are drawn.
    def test_malformed_rows(self):
        path = os.path.join(self.tmp, "bad.json")
        with open(path, "wb") as f:
            f.write(b'{"mode":"putread","label":"new-64-1","size":64,"clients":1,'
                    b'"ops_per_s":100000,"gb_per_s":0.0064}\n')
            f.write(b'\xff\xfe{"not": utf-8 \x80}\n[1, 2]\n')
            f.write(b'{"mode":"queue","run":"throughput","impl":"shmb"}\n')
        r = self.draw("--results", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("shmbroker put+read", self.svg("objects-throughput.svg"))
        self.assertIn("queue-throughput.svg not drawn", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    # Files without figures: an error that says to run the benchmark first.
    def test_no_figures(self):
        r = self.draw("--results", self.write("empty.json", []))
        self.assertEqual(r.returncode, 1)
        self.assertIn("run make bench", r.stderr)


if __name__ == "__main__":
    unittest.main()
