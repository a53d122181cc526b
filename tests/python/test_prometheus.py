# SPDX-License-Identifier: Apache-2.0
"""shmbrokerctl status --prometheus read back with Prometheus's own text
parser (Debian's python3-prometheus-client): with the daemon up, and with
the daemon gone, stopped or never started, when the file must still parse
and say shmbroker_up 0."""

import os
import re
import signal
import subprocess
import unittest

import support

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # scripts/install-deps.sh test installs it
    text_string_to_metric_families = None

CTL = os.path.abspath(os.environ.get("SHMBROKERCTL")
                      or os.path.join(os.path.dirname(support.daemon_binary()), "shmbrokerctl"))
NAME = re.compile(r"^shmbroker_[a-z][a-z0-9_]*$")


def ctl(*args):
    return subprocess.run([CTL] + list(args), stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=60)


@unittest.skipIf(text_string_to_metric_families is None,
                 "python3-prometheus-client is not installed")
class PrometheusTest(unittest.TestCase):

    def parse(self, text):
        """The families of text, which must be valid exposition."""
        return {f.name: f for f in text_string_to_metric_families(text)}

    def scrape(self, socket_path, *extra):
        r = ctl("--socket", socket_path, "status", "--prometheus", *extra)
        return r, r.stdout.decode()

    def assert_down(self, r, text, why):
        """A scrape of a daemon that did not answer: exit 0, a valid file that
        is shmbroker_up 0 alone, the reason on stderr."""
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        families = self.parse(text)
        self.assertEqual(list(families), ["shmbroker_up"], text)
        self.assertEqual([s.value for s in families["shmbroker_up"].samples], [0.0])
        self.assertIn(why, r.stderr.decode(errors="replace"))

    # A daemon with two pools: every family parses, shmbroker_up is 1,
    # shmbroker_info carries the version and the layout, each pool has its
    # samples, and every name keeps Prometheus's conventions (the unit last,
    # counters in _total and only they).
    def test_up_parses_and_follows_naming(self):
        d = support.Daemon(size="1M", args=["--pool", "main:2M", "--pool", "cache:2M"])
        self.addCleanup(d.cleanup)
        d.start()
        with d.client() as c:
            c.put("prom-key", b"x" * 100)
        r, text = self.scrape(d.socket_path)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        families = self.parse(text)
        self.assertEqual([s.value for s in families["shmbroker_up"].samples], [1.0])
        info = families["shmbroker_info"].samples
        self.assertEqual(len(info), 1)
        self.assertEqual(info[0].value, 1.0)
        self.assertEqual(set(info[0].labels), {"version", "layout", "protocol"})
        self.assertRegex(info[0].labels["version"], r"^\d+\.\d+\.\d+")
        self.assertRegex(info[0].labels["layout"], r"^\d+$")
        pools = {s.labels["pool"] for s in families["shmbroker_objects"].samples}
        self.assertEqual(pools, {"main", "cache"})
        objects = {s.labels["pool"]: s.value for s in families["shmbroker_objects"].samples}
        self.assertEqual(objects["main"], 1.0)
        self.assertEqual(
            [s.value for s in families["shmbroker_commits"].samples
             if s.labels["pool"] == "main"], [1.0])
        for name, family in families.items():
            with self.subTest(metric=name):
                self.assertRegex(name, NAME)
                self.assertTrue(family.documentation, "no HELP")
                self.assertIn(family.type, ("gauge", "counter"))
                for sample in family.samples:
                    self.assertRegex(sample.name, NAME)
                    if family.type == "counter":
                        self.assertTrue(sample.name.endswith("_total"), sample.name)
                    else:
                        self.assertNotIn("_total", sample.name)
                bare = name[:-len("_total")] if name.endswith("_total") else name
                for unit in ("bytes", "seconds"):
                    # A unit comes last, and a figure of that unit says it.
                    self.assertNotIn("_%s_" % unit, bare)
                    if unit in family.documentation.lower().replace("size", "bytes"):
                        self.assertTrue(bare.endswith("_" + unit),
                                        "%s measures %s" % (name, unit))
                if name.endswith("_info"):
                    self.assertEqual([s.value for s in family.samples], [1.0])
        self.assertIn("shmbroker_uptime_seconds", families)
        self.assertIn("shmbroker_used_bytes", families)

    # No daemon at the socket: a file that parses, shmbroker_up 0 and
    # nothing else (no figures of a daemon that is not there), exit 0.
    def test_down_no_socket(self):
        d = support.Daemon()
        self.addCleanup(d.cleanup)
        r, text = self.scrape(d.socket_path)
        self.assert_down(r, text, "Cannot connect to shmbrokerd at %s" % d.socket_path)

    # A daemon killed: its socket file stays and refuses.
    def test_down_killed(self):
        d = support.Daemon()
        self.addCleanup(d.cleanup)
        d.start()
        r, text = self.scrape(d.socket_path)
        self.assertEqual([s.value for s in self.parse(text)["shmbroker_up"].samples], [1.0])
        d.kill()
        r, text = self.scrape(d.socket_path)
        self.assert_down(r, text, "Connection refused")

    # A daemon that accepts but does not answer (stopped): after --timeout,
    # the same.
    def test_down_not_answering(self):
        d = support.Daemon()
        self.addCleanup(d.cleanup)
        d.start()
        d.proc.send_signal(signal.SIGSTOP)
        self.addCleanup(d.proc.send_signal, signal.SIGCONT)
        r, text = self.scrape(d.socket_path, "--timeout", "1")
        self.assert_down(r, text, "did not answer within 1 s")


if __name__ == "__main__":
    unittest.main()
