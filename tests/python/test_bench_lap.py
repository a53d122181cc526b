# SPDX-License-Identifier: Apache-2.0
"""shmb-bench's untimed first lap (tests/bench/bench.c, --lap): a timed run
first does a lap that its figures leave out and its JSON reports apart; a
run by count (--ops, which scripts/bench.sh's system-call count uses) has
none. shmb-bench is looked for beside $SHMBROKERD (make test builds it)."""

import json
import os
import subprocess
import unittest

import shmbroker

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DAEMON = os.environ.get("SHMBROKERD", os.path.join(ROOT, "build", "shmbrokerd"))
BENCH = os.path.join(os.path.dirname(os.path.abspath(DAEMON)), "shmb-bench")


class FirstLapTest(unittest.TestCase):
    def setUp(self):
        if not os.access(BENCH, os.X_OK):
            self.fail("%s is missing: make %s" % (BENCH, os.path.relpath(BENCH, ROOT)))

    def bench(self, *args):
        r = subprocess.run([BENCH] + list(args), capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])

    # A timed run reports its first lap apart: done (units and a rate), and
    # --lap 0 turns it off.
    def test_timed_run_has_a_first_lap(self):
        row = self.bench("--mode", "memcpy", "--size", "4096", "--seconds", "0.2",
                         "--lap", "0.05")
        self.assertGreater(row["first_lap_ops"], 0)
        self.assertGreater(row["first_lap_ops_per_s"], 0)
        self.assertGreater(row["ops"], 0)
        row = self.bench("--mode", "memcpy", "--size", "4096", "--seconds", "0.1", "--lap", "0")
        self.assertEqual(row["first_lap_ops"], 0)

    # A run by count does exactly that many, with no lap: every read the
    # library counted is one of them.
    def test_counted_run_has_none(self):
        d = shmbroker.spawn_daemon("64M", binary=DAEMON)
        self.addCleanup(d.stop)
        row = self.bench("--mode", "putread", "--socket", d.socket_path, "--size", "64",
                         "--ops", "1000")
        self.assertEqual(row["first_lap_ops"], 0)
        self.assertEqual(row["ops"], 1000)
        self.assertEqual(row["reads_fast"] + row["reads_fallback"], 1000)

    # The lap's objects are left out of the figures, not lost: every put+read
    # of the lap and of the run was read (the library counts them all).
    def test_lap_is_left_out_of_the_figures(self):
        d = shmbroker.spawn_daemon("64M", binary=DAEMON)
        self.addCleanup(d.stop)
        row = self.bench("--mode", "putread", "--socket", d.socket_path, "--size", "64",
                         "--seconds", "0.2", "--lap", "0.05")
        self.assertGreater(row["first_lap_ops"], 0)
        self.assertEqual(row["ops"] + row["first_lap_ops"],
                         row["reads_fast"] + row["reads_fallback"])


if __name__ == "__main__":
    unittest.main()
