# SPDX-License-Identifier: Apache-2.0
"""The queue benchmark's failures: shmb-queue-bench (tests/bench/queue_bench.c)
ends every run with a result or a reason, and scripts/bench.sh retries a
reference's failed run once, lists every failure with its reason, and fails
make bench only for a failure of ours. The summariser's cases run bench.sh
(BENCH_ONLY=queues) over stand-in binaries that fail where told, so they
take seconds; shmb-queue-bench is looked for beside $SHMBROKERD (make test
builds it)."""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DAEMON = os.environ.get("SHMBROKERD", os.path.join(ROOT, "build", "shmbrokerd"))
QBENCH = os.path.join(os.path.dirname(os.path.abspath(DAEMON)), "shmb-queue-bench")

# A stand-in shmb-queue-bench: one JSON line per run, except for the run whose
# label and kind $FAKE_FAIL names ("LABEL RUN TIMES HOW"), which fails its
# first TIMES tries, killed by SIGALRM with nothing printed (HOW=alarm) or
# with status 3 and nothing printed (HOW=status). Every try is logged.
FAKE_QBENCH = r"""#!/bin/sh
impl= run= label= size= readers=
while [ $# -gt 0 ]; do
    case $1 in
    --impl) impl=$2 ;; --run) run=$2 ;; --label) label=$2 ;;
    --size) size=$2 ;; --readers) readers=$2 ;;
    esac
    shift
done
echo "$label $run" >>"$FAKE_STATE/calls"
set -- $FAKE_FAIL
if [ "$label" = "$1" ] && [ "$run" = "$2" ]; then
    n=$(grep -c "^$label $run\$" "$FAKE_STATE/calls")
    if [ "$n" -le "$3" ]; then
        [ "$4" = alarm ] && kill -ALRM $$
        exit 3
    fi
fi
printf '{"mode":"queue","impl":"%s","run":"%s","label":"%s","size":%s,"readers":%s,' \
    "$impl" "$run" "$label" "$size" "$readers"
printf '"msgs":1000,"received_min":1000,"lost":0,"seconds":0.2,"msgs_per_s":4321.0,'
printf '"gb_per_s":0.0100,"p50_us":5.000,"p99_us":9.000,"p999_us":12.000,'
printf '"cpu_s_per_reader":0.0010,"first_lap_msgs":20,"first_lap_msgs_per_s":999.0}\n'
"""

STUBS = {
    # A daemon that waits to be stopped; bench.sh's ready check; Redis, which
    # bench.sh only looks for here; a Python without vLLM or matplotlib.
    "build/shmbrokerd": "#!/bin/sh\nexec sleep 300\n",
    "build/shmb-bench": "#!/bin/sh\nexit 0\n",
    "build/shmb-queue-bench": FAKE_QBENCH,
    "bin/redis-server": "#!/bin/sh\necho 'Redis server v=0.0.0'\n",
    "bin/python3": "#!/bin/sh\nexit 1\n",
}


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="shmb-bench-test-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        for name, text in STUBS.items():
            path = os.path.join(self.dir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o755)

    def bench(self, fail):
        env = {k: v for k, v in os.environ.items() if k != "VLLM_SRC"}
        env.update(BENCH_ONLY="queues", BENCH_QUICK="1", FAKE_STATE=self.dir, FAKE_FAIL=fail,
                   PYTHON=os.path.join(self.dir, "bin", "python3"),
                   PATH=os.path.join(self.dir, "bin") + ":" + env.get("PATH", "/usr/bin:/bin"))
        r = subprocess.run(["sh", os.path.join(ROOT, "scripts", "bench.sh"),
                            os.path.join(self.dir, "build")],
                           capture_output=True, text=True, timeout=300, env=env)
        with open(os.path.join(self.dir, "calls")) as f:
            calls = f.read().splitlines()
        return r, calls

    @staticmethod
    def tput_row(out, size, readers):
        rows = [line for line in out.splitlines()
                if re.match(r"^%s +%d \| +\S+ +\S+ \| +\S+ \| +\S+ \| +\S+ \|" % (size, readers),
                            line)]
        if len(rows) != 1:
            raise AssertionError("no single throughput row for %s x%d in:\n%s"
                                 % (size, readers, out))
        return [cell.strip() for cell in rows[0].split("|")]

    # A reference's run that fails once is run again: the table has its
    # second try's figure, the first failure is listed with a reason (the
    # program died of SIGALRM, printing nothing), and the run succeeds.
    def test_reference_failing_once_is_retried(self):
        r, calls = self.bench("zmq-64-4 throughput 1 alarm")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(calls.count("zmq-64-4 throughput"), 2)
        self.assertEqual(self.tput_row(r.stdout, "64 B", 4)[3], "4321")
        self.assertRegex(r.stdout, r"retried once[^\n]*\n(.*\n)*  --impl zmq --run throughput "
                         r"--size 64 --readers 4 .*--label zmq-64-4: killed by signal 14 "
                         r"\(SIGALRM\)")
        self.assertNotIn("Queue benchmark failures", r.stdout)

    # A reference's run that fails twice shows as fail, is listed with its
    # reason (never an empty one), named in the last lines, and does not fail
    # the run: our figures are what it is for.
    def test_reference_failing_twice_does_not_fail_the_run(self):
        r, calls = self.bench("zmq-64-4 throughput 2 status")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(calls.count("zmq-64-4 throughput"), 2)
        self.assertEqual(self.tput_row(r.stdout, "64 B", 4)[3], "fail")
        self.assertRegex(r.stdout, r"Queue benchmark failures:\n  reference, failed twice, "
                         r"--impl zmq --run throughput --size 64 --readers 4 .*--label "
                         r"zmq-64-4: exited with status 3, nothing printed\n")
        self.assertIn("reference runs that failed twice (fail in the tables; they do not fail "
                      "the run): zmq-64-4", r.stdout)
        self.assertNotRegex(r.stdout, r"--label \S+: *\n")
        self.assertIn("messages/s >= ZeroMQ's: met in 7 of 8; no figure at 64 B x4 (a run "
                      "failed)\n", r.stdout)

    # A failed run of ours is not retried, is listed with its reason, named
    # in the last line, and fails the run.
    def test_our_failure_fails_the_run(self):
        r, calls = self.bench("shmb-64-4 throughput 1 status")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertEqual(calls.count("shmb-64-4 throughput"), 1)
        self.assertEqual(self.tput_row(r.stdout, "64 B", 4)[1].split()[0], "fail")
        self.assertIn("  ours, --impl shmb --run throughput --size 64 --readers 4", r.stdout)
        self.assertIn("--label shmb-64-4: exited with status 3, nothing printed", r.stdout)
        self.assertEqual(r.stdout.rstrip().splitlines()[-1],
                         "FAILED: our queue runs shmb-64-4 (reasons under the queue tables)")


class QueueBenchTest(unittest.TestCase):
    def setUp(self):
        if not os.access(QBENCH, os.X_OK):
            self.fail("%s is missing: make %s" % (QBENCH, os.path.relpath(QBENCH, ROOT)))

    # ZeroMQ readers slower than the writer (each pauses after every
    # message) are behind by their whole pipe when the writer ends: every
    # one still gets every message and the end, and the run finishes.
    def test_zmq_slow_readers_get_every_message(self):
        r = subprocess.run([QBENCH, "--impl", "zmq", "--run", "throughput", "--size", "64",
                            "--readers", "2", "--seconds", "0.2", "--reader-pause-us", "20"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        row = json.loads([line for line in r.stdout.splitlines() if line.startswith("{")][-1])
        self.assertGreater(row["msgs"], 0)
        self.assertEqual(row["received_min"], row["msgs"])
        self.assertEqual(row["lost"], 0)

    # A reader killed during a run fails it with a reason that says so: the
    # reader and the signal, not an empty text.
    def test_killed_reader_is_named(self):
        p = subprocess.Popen([QBENCH, "--impl", "zmq", "--run", "throughput", "--size", "64",
                              "--readers", "2", "--seconds", "1.5", "--reader-pause-us", "1000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            children = "/proc/%d/task/%d/children" % (p.pid, p.pid)
            deadline = time.monotonic() + 30
            kids = []
            while len(kids) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
                with open(children) as f:
                    kids = f.read().split()
            self.assertEqual(len(kids), 2, "the readers were not forked")
            time.sleep(0.5)
            os.kill(int(kids[1]), signal.SIGKILL)
            out, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        self.assertEqual(p.returncode, 1, err)
        self.assertRegex(err, r"zmq throughput: reader 1 failed: killed by signal 9 \(\w+\) "
                         r"after \d+ messages")


if __name__ == "__main__":
    unittest.main()
