#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Install the Debian packages shmbroker needs when pkg-config cannot find them.
# Usage: scripts/install-deps.sh [build|test|bench|bench-vllm|deb|arm64|wheel]
# build: libuv, jansson, and UCX (libucx-dev) and libcrypto (libssl-dev) for
# shmbroker-relay; test and bench add ucx-utils and iproute2 (the relay test
# and bench); test adds cmocka, clang with its sanitizer and
# fuzzer runtimes (the fuzz target), valgrind (the soak under memcheck, and
# the instruction count with python3) and systemd (systemd-analyze and
# systemd-socket-activate, for the systemd tests), python3-numpy,
# python3-setuptools, python3-pip, python3-torch and
# python3-prometheus-client (the Python tests), python3-venv and python3-yaml
# (the packaging tests), python3-matplotlib (the charts' test); test and
# bench add libzmq3-dev (the queue benchmark's ZeroMQ reference, whose
# failures test_bench_queue.py tries); bench adds redis-server, redis-tools,
# python3-redis, python3-numpy and python3-matplotlib (the charts);
# bench-vllm adds python3-torch, python3-zmq and python3-numpy (what vLLM's
# shm_broadcast.py and shm_object_storage.py import) and python3-matplotlib;
# deb adds Debian's packaging
# tools (debhelper, dh-python, dpkg-dev, lintian) and python3; arm64 adds
# what `make test-arm64` needs on the host: Debian's cross compiler for
# arm64 (gcc-aarch64-linux-gnu, its binutils and libc6-dev-arm64-cross),
# qemu-user-static (and its binfmt_misc line), debootstrap for the arm64
# root (whose own packages come from the root's apt, not the host's) and
# file; wheel (make wheel) needs only python3 and python3-venv, for the wheel
# and the venv README installs it in.
# Does nothing when everything is present.
set -eu

want="${1:-build}"
pkgs=""
need() { pkgs="$pkgs $1"; }

have_deb() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }

if [ "$want" = wheel ]; then
    command -v python3 >/dev/null 2>&1 || need python3
    have_deb python3-venv || need python3-venv
fi
[ "$want" = wheel ] || command -v pkg-config >/dev/null 2>&1 || need pkg-config
command -v cc >/dev/null 2>&1 || [ "$want" = wheel ] || need gcc
command -v make >/dev/null 2>&1 || need make
if [ "$want" = wheel ]; then
    :
elif command -v pkg-config >/dev/null 2>&1; then
    pkg-config --exists libuv || need libuv1-dev
    pkg-config --exists jansson || need libjansson-dev
    # shmbroker-relay: UCX (Debian 12's 1.13) and libcrypto for its key's HMAC.
    pkg-config --exists ucx || need libucx-dev
    pkg-config --exists libcrypto || need libssl-dev
    if [ "$want" != build ] && [ "$want" != deb ] && [ "$want" != arm64 ]; then
        pkg-config --exists cmocka || need libcmocka-dev
    fi
else
    need libuv1-dev
    need libjansson-dev
    need libucx-dev
    need libssl-dev
    [ "$want" = build ] || [ "$want" = deb ] || [ "$want" = arm64 ] || need libcmocka-dev
fi
if [ "$want" = test ] || [ "$want" = bench ]; then
    # tests/relay and the relay's bench: ucx_perftest (the UCX floor) and
    # ip netns (two hosts' namespaces joined by a veth pair).
    command -v ucx_perftest >/dev/null 2>&1 || need ucx-utils
    command -v ip >/dev/null 2>&1 || need iproute2
    # tests/bench/queue_bench.c: ZeroMQ PUB/SUB, the queues' reference
    # (tests/python/test_bench_queue.py runs it).
    pkg-config --exists libzmq 2>/dev/null || need libzmq3-dev
fi
if [ "$want" = test ]; then
    command -v clang >/dev/null 2>&1 || need clang
    have_deb libclang-rt-14-dev || need libclang-rt-14-dev
    command -v valgrind >/dev/null 2>&1 || need valgrind
    # scripts/bench_instructions.sh drives the daemon from a Python script.
    command -v python3 >/dev/null 2>&1 || need python3
    # tests/python: numpy for the zero-copy tests, setuptools and pip for the
    # package's install tests (Debian's, for Debian's python3).
    have_deb python3-numpy || need python3-numpy
    have_deb python3-setuptools || need python3-setuptools
    have_deb python3-pip || need python3-pip
    # status --prometheus is read back with Prometheus's own text parser.
    have_deb python3-prometheus-client || need python3-prometheus-client
    # tests/packaging: the wheel installed into a fresh venv (ensurepip),
    # the deploy manifests parsed as YAML.
    have_deb python3-venv || need python3-venv
    have_deb python3-yaml || need python3-yaml
    # The vLLM drop-in tests: MessageQueue.create_from_process_group over a
    # torch ProcessGroup (gloo, on the CPU), as vLLM's parallel_state makes it.
    have_deb python3-torch || need python3-torch
    # tests/python/test_bench_charts.py draws the benchmark's charts.
    have_deb python3-matplotlib || need python3-matplotlib
    # The systemd tests run both; a container image usually has neither.
    if ! command -v systemd-analyze >/dev/null 2>&1 ||
        ! command -v systemd-socket-activate >/dev/null 2>&1; then
        need systemd
    fi
    # tests/systemd boots the installed units in a container it debootstraps.
    command -v systemd-nspawn >/dev/null 2>&1 || need systemd-container
    command -v debootstrap >/dev/null 2>&1 || need debootstrap
fi
if [ "$want" = bench ]; then
    command -v redis-server >/dev/null 2>&1 || need redis-server
    command -v redis-benchmark >/dev/null 2>&1 || need redis-tools
    # tests/bench/bench_python.py: Python against redis-py, with numpy arrays.
    command -v python3 >/dev/null 2>&1 || need python3
    have_deb python3-redis || need python3-redis
    have_deb python3-numpy || need python3-numpy
    # scripts/bench_charts.py draws the run's charts.
    have_deb python3-matplotlib || need python3-matplotlib
fi
if [ "$want" = bench-vllm ]; then
    # tests/bench/bench_vllm.py: vLLM's two files import torch and pyzmq
    # (vLLM's own requirements), the store's array cell numpy, the charts
    # matplotlib.
    command -v python3 >/dev/null 2>&1 || need python3
    have_deb python3-numpy || need python3-numpy
    have_deb python3-torch || need python3-torch
    have_deb python3-zmq || need python3-zmq
    have_deb python3-matplotlib || need python3-matplotlib
fi

if [ "$want" = arm64 ]; then
    command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || need gcc-aarch64-linux-gnu
    command -v aarch64-linux-gnu-ld >/dev/null 2>&1 || need binutils-aarch64-linux-gnu
    # The cross C library (only recommended by the compiler): its headers
    # come before the root's in the cross compiler's search.
    have_deb libc6-dev-arm64-cross || need libc6-dev-arm64-cross
    command -v qemu-aarch64-static >/dev/null 2>&1 || need qemu-user-static
    command -v debootstrap >/dev/null 2>&1 || need debootstrap
    command -v file >/dev/null 2>&1 || need file
fi

if [ "$want" = deb ]; then
    have_deb debhelper || need debhelper
    have_deb dh-python || need dh-python
    have_deb dpkg-dev || need dpkg-dev
    have_deb lintian || need lintian
    have_deb python3 || need python3
    # The packages are built from a copy of the files git tracks.
    command -v git >/dev/null 2>&1 || need git
fi

[ -n "$pkgs" ] || exit 0

echo "shmbroker: installing missing packages:$pkgs" >&2
if [ "$(id -u)" -eq 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
else
    echo "shmbroker: need root (or sudo) to install:$pkgs" >&2
    echo "shmbroker: install them by hand: apt-get install$pkgs" >&2
    # The wheel itself needs only python3: build it, for a venv elsewhere.
    [ "$want" != wheel ] || exit 0
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Another apt (unattended-upgrades on a fresh machine) may hold the dpkg
# lock: wait for it, up to SHMB_APT_LOCK_TIMEOUT seconds, instead of failing.
lock_timeout="${SHMB_APT_LOCK_TIMEOUT:-600}"
case "$lock_timeout" in
'' | *[!0-9]*)
    echo "shmbroker: SHMB_APT_LOCK_TIMEOUT must be a number of seconds, not '$lock_timeout'" >&2
    exit 1
    ;;
esac
apt_get() {
    # shellcheck disable=SC2086
    $sudo apt-get -o DPkg::Lock::Timeout="$lock_timeout" "$@"
}
# apt-get update takes the package lists' lock, which DPkg::Lock::Timeout
# does not cover: while another apt holds it, try again every 3 s.
apt_update() {
    waited=0
    while :; do
        rc=0
        out=$(apt_get update -q 2>&1) || rc=$?
        printf '%s\n' "$out"
        [ "$rc" -ne 0 ] || return 0
        if ! printf '%s\n' "$out" | grep -q 'Could not get lock'; then
            return "$rc"
        fi
        if [ "$waited" -ge "$lock_timeout" ]; then
            echo "shmbroker: another apt held the package lists' lock for ${waited} s; run 'make' again when it is done (or set SHMB_APT_LOCK_TIMEOUT)" >&2
            return "$rc"
        fi
        echo "shmbroker: another apt holds the package lists' lock; waiting (${waited} of ${lock_timeout} s)" >&2
        sleep 3
        waited=$((waited + 3))
    done
}
# shellcheck disable=SC2086
if ! apt_get install -y -q --no-install-recommends $pkgs; then
    apt_update
    apt_get install -y -q --no-install-recommends $pkgs
fi
