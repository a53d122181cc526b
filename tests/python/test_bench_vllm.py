# SPDX-License-Identifier: Apache-2.0
"""tests/bench/bench_vllm.py's own logic, without vLLM: how it loads vLLM's
two files from a VLLM_SRC tree (here a fake tree whose two modules hand out
shmbroker's classes, importing what vLLM's import from vllm.*), what it says
when there is no vLLM, and that a quick run reports every cell with a ratio
taken from both sides' figures."""

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
HARNESS = os.path.join(ROOT, "tests", "bench", "bench_vllm.py")

# The fake tree's modules import from vllm.* what vLLM's do, so that a run
# fails when the harness's stand-ins for them are missing.
FAKE_STORE = """\
import vllm.envs as envs
from vllm.logger import init_logger
from shmbroker.vllm import (ObjectSerde, SingleWriterShmRingBuffer,
                            SingleWriterShmObjectStorage)
logger = init_logger(__name__)
"""
FAKE_QUEUE = """\
import vllm.envs as envs
from vllm.distributed.utils import StatelessProcessGroup
from vllm.logger import init_logger
from vllm.utils import get_ip, get_open_port, get_open_zmq_ipc_path, is_valid_ipv6_address
from shmbroker import MessageQueue
INTERVAL = envs.VLLM_RINGBUFFER_WARNING_INTERVAL
assert get_open_zmq_ipc_path().startswith("ipc://") and not is_valid_ipv6_address(get_ip())
assert 0 < get_open_port() < 65536
"""


class BenchVllmTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="shmb-bench-vllm-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.path.join(ROOT, "client", "python")
        self.env.setdefault("SHMBROKERD", os.path.join(ROOT, "build", "shmbrokerd"))

    def run_harness(self, *args, timeout=120):
        return subprocess.run([sys.executable, HARNESS] + list(args), env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    # A VLLM_SRC that is not a vLLM tree: status 2 and how to get one.
    def test_not_a_tree(self):
        self.env["VLLM_SRC"] = self.tmp
        r = self.run_harness("--quick")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("is not a vLLM source tree", r.stderr)
        self.assertIn("VLLM_SRC=/path/to/vllm make bench-vllm", r.stderr)

    # No VLLM_SRC and no vllm package (a path where none is): status 2, saying
    # how to get one, before anything is measured.
    def test_no_vllm(self):
        self.env.pop("VLLM_SRC", None)
        r = subprocess.run([sys.executable, "-S", "-s", HARNESS, "--quick"], env=self.env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("no VLLM_SRC and no vllm package", r.stderr)
        self.assertIn("pip install vllm", r.stderr)
        self.assertNotIn("round 1", r.stderr)

    # A tree's two files are loaded with stand-ins for the rest of vllm.*; the
    # report and the JSON carry every cell of the store and the queue, each
    # side's figure positive and the ratio the quotient of the two.
    def fake_tree(self):
        dc = os.path.join(self.tmp, "vllm", "distributed", "device_communicators")
        os.makedirs(dc)
        with open(os.path.join(dc, "shm_object_storage.py"), "w") as f:
            f.write(FAKE_STORE)
        with open(os.path.join(dc, "shm_broadcast.py"), "w") as f:
            f.write(FAKE_QUEUE)
        self.env["VLLM_SRC"] = self.tmp

    # No daemon binary: status 2, naming SHMBROKERD, before anything is measured.
    def test_no_daemon(self):
        self.fake_tree()
        self.env["SHMBROKERD"] = os.path.join(self.tmp, "no-such-shmbrokerd")
        r = self.run_harness("--quick")
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("cannot start shmbrokerd", r.stderr)
        self.assertIn("SHMBROKERD", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_quick_run_from_a_tree(self):
        self.fake_tree()
        out = os.path.join(self.tmp, "out.json")
        r = self.run_harness("--quick", "--seconds", "0.05", "--json", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("vLLM from %s" % self.tmp, r.stdout)
        self.assertIn("First lap", r.stdout)
        rows = {}
        with open(out) as f:
            for line in f:
                row = json.loads(line)
                rows[row["key"]] = row
        for key in ("store 64 KiB", "store 16 MiB", "store dict+1MiB-array", "store open_s",
                    "store first:1 MiB", "queue 64 B x1", "queue 1 MiB x4",
                    "queue first:4 KiB x4", "queue p50:64 B x1 every 200 us",
                    "queue p99:4 KiB x4 every 5000 us", "queue cpu:64 B x4 every 5000 us",
                    "queue idle cpu x1", "queue cpu-us/msg:64 B x4"):
            self.assertIn(key, rows)
        # CPU per message back to back: lower is better for ours.
        self.assertFalse(rows["queue cpu-us/msg:64 B x4"]["higher_is_better"])
        for key in ("store 1 MiB", "queue 4 KiB x4", "queue p50:4 KiB x1 every 5000 us",
                    "store put_us:64 KiB", "store get_us:dict+1MiB-array"):
            row = rows[key]
            self.assertGreater(row["vllm"], 0, key)
            self.assertGreater(row["ours"], 0, key)
            self.assertAlmostEqual(row["ratio"], row["ours"] / row["vllm"], places=6)
        # Each store cell's put and get times sit beside its pairs/s, lower better.
        lines = r.stdout.splitlines()
        at = [i for i, line in enumerate(lines) if line.startswith("store 64 KiB pairs/s")]
        self.assertEqual(len(at), 1, r.stdout)
        self.assertTrue(lines[at[0] + 1].startswith("store put_us:64 KiB"), r.stdout)
        self.assertTrue(lines[at[0] + 2].startswith("store get_us:64 KiB"), r.stdout)
        self.assertFalse(rows["store put_us:16 MiB"]["higher_is_better"])
        # The 64 KiB cell once more with writer and reader on one CPU.
        one = rows["store 64 KiB one CPU"]
        self.assertTrue(one["higher_is_better"])
        self.assertGreater(one["vllm"], 0)
        self.assertGreater(one["ours"], 0)
        self.assertGreater(rows["store put_us:64 KiB one CPU"]["ours"], 0)

    # --only store measures the store's cells and no queue.
    def test_only_store(self):
        self.fake_tree()
        out = os.path.join(self.tmp, "out.json")
        r = self.run_harness("--quick", "--seconds", "0.05", "--only", "store", "--json", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            rows = {row["key"]: row for row in map(json.loads, f)}
        keys = list(rows)
        self.assertIn("store get_us:16 MiB", keys)
        # The copies that bound the 1 MiB cells, timed in each side's process.
        self.assertIn("store memcpy_us:1 MiB in", keys)
        self.assertIn("store memcpy_us:1 MiB out", keys)
        self.assertFalse(rows["store memcpy_us:1 MiB in"]["higher_is_better"])
        self.assertEqual([k for k in keys if not k.startswith("store ")], [])

    # profile_store.py times the steps of put and get in the store's
    # lock-step and names each, with put's and get's own wall and CPU time.
    def test_profile_store(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bench",
                                                         "profile_store.py"),
                            "--cell", "dict", "--pairs", "30", "--ring-mib", "64"],
                           capture_output=True, text=True, timeout=120, env=self.env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for line in ("put put (wall)", "put put (cpu)", "put Wire._send",
                     "put PickleSerde.serialize", "get get (wall)",
                     "get PickleSerde.deserialize", "get ShmBrokerObjectStorage._get_mapped"):
            self.assertIn(line, r.stdout)
        self.assertRegex(r.stdout, r"dict: \d+ pairs/s in lock-step")

    # --one-cpu puts the writer, its private daemon and the reader on one
    # CPU; --import loads modules first (torch, as a vLLM process has).
    def test_profile_store_on_one_cpu(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "bench",
                                                         "profile_store.py"),
                            "--cell", "64KiB", "--pairs", "30", "--ring-mib", "64",
                            "--steps", "none", "--one-cpu", "--import", "json,array"],
                           capture_output=True, text=True, timeout=120, env=self.env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"64KiB: \d+ pairs/s in lock-step")
        cpus = re.search(r"cpus: writer (\[\d+\]), daemon (\[\d+\]), reader (\[\d+\])",
                         r.stdout)
        self.assertIsNotNone(cpus, r.stdout)
        self.assertEqual(len(set(cpus.groups())), 1, r.stdout)

    # --only queue, --readers and --queue-cells measure the queue alone, with
    # the reader counts and the cells asked for: nothing of the store, no
    # paced cell, no other reader count.
    def test_queue_alone(self):
        self.fake_tree()
        out = os.path.join(self.tmp, "out.json")
        r = self.run_harness("--quick", "--seconds", "0.05", "--json", out, "--only", "queue",
                             "--readers", "2", "--queue-cells", "b2b")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            keys = {json.loads(line)["key"] for line in f}
        self.assertIn("queue 64 B x2", keys)
        self.assertIn("queue cpu-us/msg:1 MiB x2", keys)
        self.assertEqual([k for k in keys if "store" in k or "every" in k or " x1" in k
                          or "timer_late" in k], [])
        # The paced cells come with what bounds them: how late a timed
        # wake-up comes, in each side's process, lower better.
        out2 = os.path.join(self.tmp, "paced.json")
        r = self.run_harness("--quick", "--seconds", "0.05", "--json", out2, "--only", "queue",
                             "--readers", "1", "--queue-cells", "paced")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out2) as f:
            rows = {row["key"]: row for row in map(json.loads, f)}
        for key in ("queue timer_late_us:150 us x1", "queue timer_late_us:4800 us x1"):
            self.assertIn(key, rows)
            self.assertFalse(rows[key]["higher_is_better"])
        bad = self.run_harness("--quick", "--readers", "0,x")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--readers", bad.stderr)


if __name__ == "__main__":
    unittest.main()
