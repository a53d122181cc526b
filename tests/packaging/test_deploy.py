#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""deploy/: every Kubernetes manifest parses, and the fields the docs rely
on hold: the daemon's flags exist and pass its --check-config, the socket is
in the hostPath directory the worker mounts, the worker mounts nothing else
(no hostIPC, no /dev/shm), its groups let it into the socket's group, the
uid is the Dockerfile's, the image is this version's. Then the DaemonSet's
daemon (its pool made small) and the worker's own script run here and put
and get through the memfd pool. Prints PASS/FAIL per case."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KUBE = os.path.join(ROOT, "deploy", "kubernetes")
DOCKERFILE = os.path.join(ROOT, "deploy", "docker", "Dockerfile")


def build_path(env, default):
    p = os.environ.get(env) or default
    return p if os.path.isabs(p) else os.path.join(ROOT, p)


BUILD = build_path("SHMB_BUILD_DIR", "build")
DAEMON = build_path("SHMBROKERD", os.path.join(BUILD, "shmbrokerd"))
CTL = build_path("SHMBROKERCTL", os.path.join(BUILD, "shmbrokerctl"))
failures = 0


def check(name, ok, why=""):
    global failures
    if ok:
        print("PASS: " + name)
    else:
        failures += 1
        print("FAIL: %s: %s" % (name, why))
    sys.stdout.flush()
    return ok


def flags_of(help_text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", help_text))


def version():
    out = subprocess.run(["make", "--no-print-directory", "-s", "-C", ROOT, "print-version"],
                         stdout=subprocess.PIPE, env={k: v for k, v in os.environ.items()
                                                      if k not in ("MAKEFLAGS", "MFLAGS",
                                                                   "MAKELEVEL")})
    return out.stdout.decode().strip()


def main():
    try:
        import yaml
    except ImportError:
        check("import_yaml", False, "python3-yaml is missing (apt-get install python3-yaml)")
        return 1

    docs = {}
    for fn in sorted(os.listdir(KUBE)):
        if not fn.endswith((".yaml", ".yml")):
            continue
        path = os.path.join(KUBE, fn)
        try:
            with open(path, encoding="utf-8") as f:
                parsed = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            check("parse " + fn, False, str(e))
            continue
        ok = all(isinstance(d, dict) and d.get("apiVersion") and d.get("kind") and
                 d.get("metadata", {}).get("name") for d in parsed) and parsed
        if check("parse " + fn, ok, "a document without apiVersion, kind or metadata.name"):
            for d in parsed:
                docs[(d["kind"], d["metadata"]["name"])] = d
    ds = docs.get(("DaemonSet", "shmbrokerd"))
    pod = docs.get(("Pod", "shmbroker-worker"))
    if not check("manifests_present", ds and pod, "no DaemonSet shmbrokerd or Pod shmbroker-worker"):
        return 1

    ver = version()
    help_d = subprocess.run([DAEMON, "--help"], stdout=subprocess.PIPE).stdout.decode()
    help_c = subprocess.run([CTL, "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT).stdout.decode()
    dflags, cflags = flags_of(help_d), flags_of(help_c)

    spec = ds["spec"]["template"]["spec"]
    (daemon,) = [c for c in spec["containers"] if c["name"] == "shmbrokerd"]
    argv = [str(a) for a in daemon.get("command", [])[1:] + daemon.get("args", [])]
    unknown = [a for a in argv if a.startswith("--") and a not in dflags]
    check("daemon_flags_exist", daemon["command"][0].endswith("shmbrokerd") and not unknown,
          "flags not in shmbrokerd --help: %s" % unknown)
    r = subprocess.run([DAEMON] + argv + ["--check-config"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    check("daemon_check_config", r.returncode == 0, r.stdout.decode())
    sock = argv[argv.index("--socket") + 1] if "--socket" in argv else ""
    pool = argv[argv.index("--pool") + 1] if "--pool" in argv else ""
    check("daemon_memfd_pool", "backing=memfd" in pool.split(",")[1:], "--pool %r" % pool)

    def host_dirs(podspec, container):
        vols = {v["name"]: v for v in podspec.get("volumes", [])}
        out = {}
        for m in container.get("volumeMounts", []):
            v = vols[m["name"]]
            out[m["mountPath"]] = v
        return out

    dmounts = host_dirs(spec, daemon)
    sockdir = os.path.dirname(sock)
    v = dmounts.get(sockdir, {})
    check("daemon_socket_on_hostpath", v.get("hostPath", {}).get("path") == sockdir,
          "--socket %s is not in a hostPath volume mounted at %s" % (sock, sockdir))
    sc = daemon.get("securityContext", {})
    uid, gid = sc.get("runAsUser"), sc.get("runAsGroup")
    check("daemon_uid", uid == 10001 and gid == 10001 and sc.get("runAsNonRoot") is True,
          "runAsUser %r runAsGroup %r" % (uid, gid))
    probe = daemon.get("readinessProbe", {}).get("exec", {}).get("command", [])
    unknown = [a for a in probe if a.startswith("--") and a not in cflags]
    check("probe_ctl_flags", probe and probe[0].endswith("shmbrokerctl") and not unknown and
          sock in probe, "probe %r (flags not in shmbrokerctl --help: %s)" % (probe, unknown))

    pspec = pod["spec"]
    (worker,) = pspec["containers"]
    wmounts = host_dirs(pspec, worker)
    check("worker_mounts_only_socket_dir",
          list(wmounts) == [sockdir] and
          wmounts[sockdir].get("hostPath", {}).get("path") == sockdir and
          not pspec.get("hostIPC") and not pspec.get("hostPID") and
          not any(p.startswith("/dev/shm") for p in wmounts),
          "mounts %r, hostIPC %r" % (sorted(wmounts), pspec.get("hostIPC")))
    env = {e["name"]: e.get("value") for e in worker.get("env", [])}
    check("worker_socket_env", env.get("SHMBROKER_SOCKET") == sock,
          "SHMBROKER_SOCKET %r, the daemon's --socket %r" % (env.get("SHMBROKER_SOCKET"), sock))
    psc = pspec.get("securityContext", {})
    check("worker_in_socket_group", gid in psc.get("supplementalGroups", []) and
          psc.get("runAsUser") not in (None, 0),
          "supplementalGroups %r, the daemon's group %r" % (psc.get("supplementalGroups"), gid))

    images = {c["image"] for s in (spec, pspec)
              for c in s.get("containers", []) + s.get("initContainers", [])}
    check("image_is_this_version", images == {"shmbroker:" + ver},
          "images %r, version %s" % (sorted(images), ver))

    with open(DOCKERFILE, encoding="utf-8") as f:
        lines = [l.strip() for l in f.read().replace("\\\n", " ").splitlines()]
    froms = [l.split()[1] for l in lines if l.startswith("FROM ")]
    users = [l.split()[1] for l in lines if l.startswith("USER ")]
    check("dockerfile_debian12", froms and all(re.match(r"debian:12(-slim)?$", f) for f in froms),
          "FROM %r" % froms)
    check("dockerfile_uid", users == ["%d:%d" % (uid, gid)], "USER %r" % users)
    cmd = [l for l in lines if l.startswith("CMD ")]
    ep = [l for l in lines if l.startswith("ENTRYPOINT ")]
    import json
    cmd_argv = json.loads(cmd[0][4:]) if cmd else []
    ok = ep and json.loads(ep[0][11:])[0].endswith("shmbrokerd")
    r = subprocess.run([DAEMON] + cmd_argv + ["--check-config"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    check("dockerfile_cmd", ok and r.returncode == 0 and "--socket" in cmd_argv and
          cmd_argv[cmd_argv.index("--socket") + 1] == sock,
          "ENTRYPOINT %r CMD %r: %s" % (ep, cmd_argv, r.stdout.decode()))

    (init,) = spec.get("initContainers", [])
    run_worker(argv, worker, uid, gid, psc, [a.replace(sockdir, "@DIR@") for a in init["command"]])
    return 1 if failures else 0


def run_worker(argv, worker, uid, gid, psc, init):
    """The DaemonSet's daemon with a small pool on a private socket, and the
    worker's script as written; as root, each as the uid and groups its
    manifest gives, the socket's directory made as the init container makes
    it, and a worker outside the socket's group refused."""
    tmp = tempfile.mkdtemp(prefix="shmb-deploy-")
    os.chmod(tmp, 0o755)
    root = os.geteuid() == 0 and shutil.which("setpriv") is not None
    sockdir = os.path.join(tmp, "run")
    os.mkdir(sockdir)
    if root:  # the init container's command, on this directory
        r = subprocess.run([a.replace("@DIR@", sockdir) for a in init], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        check("init_container_command", r.returncode == 0 and "@DIR@" in init,
              "%r: %s" % (init, r.stdout.decode()))
    mysock = os.path.join(sockdir, "shmbroker.sock")
    daemon_as = ["setpriv", "--reuid", str(uid), "--regid", str(gid), "--clear-groups"] \
        if root else []
    groups = ",".join(str(g) for g in psc.get("supplementalGroups", []))
    worker_as = ["setpriv", "--reuid", str(psc["runAsUser"]), "--regid",
                 str(psc["runAsGroup"]), "--groups", groups] if root else []
    outsider_as = ["setpriv", "--reuid", str(psc["runAsUser"]), "--regid",
                   str(psc["runAsGroup"]), "--clear-groups"] if root else []
    run_argv = list(argv)
    run_argv[run_argv.index("--socket") + 1] = mysock
    i = run_argv.index("--pool") + 1
    run_argv[i] = re.sub(r"^([^:]+):[^,]+", r"\1:16M", run_argv[i])
    log = open(os.path.join(tmp, "daemon.log"), "w+")
    proc = subprocess.Popen(daemon_as + [DAEMON] + run_argv +
                            ["--stop-with-pid", str(os.getpid())],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(mysock) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        cmdline = worker["command"] + worker.get("args", [])
        wenv = dict(os.environ, SHMBROKER_SOCKET=mysock,
                    PYTHONPATH=os.path.join(ROOT, "client", "python"))
        py = os.environ.get("PYTHON") or "/usr/bin/python3"
        r = subprocess.run(worker_as + [py] + cmdline[1:], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, env=wenv, timeout=60, cwd=tmp)
        out = r.stdout.decode()
        log.seek(0)
        check("worker_script_runs" + (" (as its uid and groups)" if root else ""),
              r.returncode == 0 and out.strip() == "hello from a worker via memfd",
              "%s\n(exit %d; the daemon: %s)" % (out, r.returncode, log.read()))
        if root:
            r = subprocess.run(outsider_as + [py] + cmdline[1:], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=wenv, timeout=60, cwd=tmp)
            out = r.stdout.decode()
            check("outsider_refused", r.returncode != 0 and "hello from" not in out and
                  ("Permission denied" in out or "PermissionError" in out or "EACCES" in out),
                  "a worker outside group %d: exit %d\n%s" % (gid, r.returncode, out))
            if os.environ.get("SHMB_TEST_VERBOSE"):
                print(out)
        else:
            print("SKIP: outsider_refused (not root: cannot take the manifests' uids)")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
