#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# shmbroker on aarch64, under qemu-user: cross-compile the daemon, the
# library and the queue's C tests for arm64, then run them and the Python
# read and queue tests inside an arm64 Debian root with arm64's python3,
# every process of it (the daemon, forked and spawned children) emulated by
# qemu-aarch64 through binfmt_misc. `make test-arm64` runs this.
#
# What it shows: the code paths of another architecture (the futex system
# call's number, the atomics' machine code, the fences' calls, 64-bit
# struct layouts) run and pass. What it cannot show: qemu on an x86-64 host
# keeps the host's strong ordering, so a missing fence passes here; the
# fences' places are held by tests that record them (test_queue_order.py,
# test_read.py's TestOrderedReads), on any machine.
#
# The cached root (debootstrap of bookworm for arm64 with python3, numpy,
# libatomic1 and the -dev packages the cross build links against) lives in
# $SHMB_ARM64_ROOT/<key> (default /var/tmp/shmbroker-arm64-root); the key
# changes with the suite and the package list. The host needs root,
# binfmt_misc (mounted here when it is not) and Debian's qemu-user-static,
# debootstrap and gcc-aarch64-linux-gnu (scripts/install-deps.sh arm64).
# binfmt_misc stays mounted and qemu-aarch64 registered afterwards, as on a
# host where Debian's qemu-user-static registered it at boot.
#
# Usage: tests/arm64/run.sh [BUILD_DIR]   (default build-arm64)
# Prints PASS/FAIL/SKIP lines per test, the time each stage took, and exits
# non-zero when anything failed or a test that must run here was skipped.
set -u

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
# The build directory, inside the tree (the root sees the tree only).
build_rel="${1:-build-arm64}"
case "$build_rel" in
/* | *..*) echo "arm64: the build directory is a name inside the tree, not $build_rel" >&2
    exit 2 ;;
esac
build="$top/$build_rel"

SUITE=bookworm
PACKAGES="python3 python3-numpy libatomic1 libuv1-dev libjansson-dev libcmocka-dev"
CACHE="${SHMB_ARM64_ROOT:-/var/tmp/shmbroker-arm64-root}"
TRIPLET=aarch64-linux-gnu
# What is built, and what runs: the queue's data path over a memfd (unit),
# queues end to end through the daemon and the library, the catalog's C
# reader; the Python read tests (the scribble table's against the C reader,
# shmb-read-tool) and queue tests (run.py's filters).
C_TESTS="$build_rel/tests/test_queue $build_rel/tests/test_queues
    $build_rel/tests/test_catalog_read"
TARGETS="$build_rel/shmbrokerd $build_rel/shmbrokerctl $build_rel/libshmbroker.a \
    $build_rel/libshmbroker.so.1 $build_rel/example $build_rel/example-queue $C_TESTS
    $build_rel/tests/shmb-read-tool"
PY_TESTS="test_read. test_scribble_table. test_queues. test_queue_order."
# With 64 KiB pages: the queue's data path, C and Python, through the daemon.
C_TESTS_64K="$build_rel/tests/test_queue $build_rel/tests/test_queues"
PY_TESTS_64K="test_queues.AreaTest test_queues.QueueTest.test_broadcast_in_order test_queue_order."

t0=$(date +%s)
elapsed() {
    echo "$(($(date +%s) - t0)) s"
}

say() {
    echo "arm64: $*"
}

die() {
    echo "arm64: $*" >&2
    exit 1
}

# ---- the host ---------------------------------------------------------------

# The tools, installed through the project's dependency script when missing.
check_host() {
    case "$(uname -m)" in
    aarch64 | arm64) die "this host is aarch64 itself: run the tests natively (make test)" ;;
    esac
    [ "$(id -u)" -eq 0 ] ||
        die "needs root (debootstrap, binfmt_misc, chroot); run as root or with sudo"
    if ! command -v qemu-aarch64-static >/dev/null 2>&1 ||
        ! command -v debootstrap >/dev/null 2>&1 ||
        ! command -v $TRIPLET-gcc >/dev/null 2>&1; then
        sh "$top/scripts/install-deps.sh" arm64 || die "cannot install the arm64 tools"
    fi
    for tool in qemu-aarch64-static debootstrap $TRIPLET-gcc $TRIPLET-ld $TRIPLET-objcopy \
        unshare chroot flock; do
        command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
    done
}

# binfmt_misc runs every arm64 executable under qemu-aarch64-static: the
# ones the tests start too (the daemon, helper programs), which qemu-user
# alone would not follow into execve. Debian's qemu-user-static ships the
# registration line; its F flag opens the interpreter now, so that it
# needs no copy inside the root.
ensure_binfmt() {
    bm=/proc/sys/fs/binfmt_misc
    if [ ! -e "$bm/register" ]; then
        mount -t binfmt_misc binfmt_misc "$bm" 2>/dev/null ||
            die "cannot mount binfmt_misc on $bm (a container without it? run on the" \
                "host, or mount it there: mount -t binfmt_misc binfmt_misc $bm)"
    fi
    if [ -e "$bm/qemu-aarch64" ]; then
        grep -q '^enabled' "$bm/qemu-aarch64" ||
            die "binfmt_misc's qemu-aarch64 entry is disabled (echo 1 > $bm/qemu-aarch64)"
        # Without F the interpreter is looked up inside the root, where
        # there is none.
        grep -q '^flags:.*F' "$bm/qemu-aarch64" ||
            die "binfmt_misc's qemu-aarch64 entry lacks the F flag, so it cannot run" \
                "inside a root; remove it (echo -1 > $bm/qemu-aarch64) and run this again"
        return 0
    fi
    conf=/usr/lib/binfmt.d/qemu-aarch64.conf
    [ -r "$conf" ] || die "$conf is missing (Debian: apt install qemu-user-static)"
    grep -v '^#' "$conf" | head -n 1 >"$bm/register" 2>/dev/null ||
        die "binfmt_misc refused the registration in $conf"
    [ -e "$bm/qemu-aarch64" ] || die "qemu-aarch64 did not register with binfmt_misc"
}

# host_mirror: the Debian mirror this host's apt already uses.
. "$here/../support/host_mirror.sh"

# ---- the cached root --------------------------------------------------------

# Build the root once (under a lock: several runs may start at once) and set
# $root to it. A root is complete only once renamed into place.
prepare_root() {
    key=$(printf '%s\n%s\n' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
    root="$CACHE/$SUITE-$key"
    mkdir -p "$CACHE" || die "cannot create $CACHE"
    exec 8>"$CACHE/lock"
    flock 8
    if [ ! -f "$root/.shmb-root" ]; then
        mirror=$(host_mirror)
        [ -n "$mirror" ] || die "no Debian mirror in /etc/apt to debootstrap from"
        say "building the cached arm64 root $root" \
            "(several minutes: its packages' scripts run under qemu)"
        rm -rf "$root.new"
        include=$(echo "$PACKAGES" | tr ' ' ',')
        if ! debootstrap --arch=arm64 --variant=minbase --include="$include" "$SUITE" \
            "$root.new" "$mirror" >"$CACHE/debootstrap.log" 2>&1; then
            tail -n 5 "$CACHE/debootstrap.log" | sed 's/^/  | /'
            rm -rf "$root.new"
            die "debootstrap --arch=arm64 of $SUITE from $mirror failed" \
                "(log: $CACHE/debootstrap.log)"
        fi
        rm -f "$root.new"/var/cache/apt/archives/*.deb
        echo "$PACKAGES" >"$root.new/.shmb-root"
        mv "$root.new" "$root"
        say "cached root ready ($(elapsed))"
    fi
    flock -u 8
    exec 8>&-
}

# ---- the cross build ----------------------------------------------------------

# The daemon, the ctl, the library (static and shared), README's examples
# and the C tests below, built on this host by Debian's cross compiler and
# C library (libc6-dev-arm64-cross, the same glibc as the root's) against
# the root's libuv, jansson and cmocka (--sysroot, pkg-config's sysroot):
# no arm64 package in the host's dpkg, no compiler under emulation.
cross_build() {
    say "cross-compiling for arm64 into $build_rel"
    # shellcheck disable=SC2086
    if ! env PKG_CONFIG_SYSROOT_DIR="$root" \
        PKG_CONFIG_LIBDIR="$root/usr/lib/$TRIPLET/pkgconfig:$root/usr/share/pkgconfig" \
        ${MAKE:-make} -C "$top" --no-print-directory BUILD="$build_rel" \
        CC="$TRIPLET-gcc --sysroot=$root" LD="$TRIPLET-ld" OBJCOPY="$TRIPLET-objcopy" \
        AR="$TRIPLET-ar" $TARGETS; then
        die "the arm64 build failed"
    fi
    for f in shmbrokerd tests/test_queue; do
        file -b "$build/$f" 2>/dev/null | grep -q 'ARM aarch64' ||
            die "$build/$f is not an arm64 executable: $(file -b "$build/$f" 2>/dev/null)"
    done
    say "built ($(elapsed))"
}

# ---- the run inside the root --------------------------------------------------

# Inside a mount and PID namespace of its own: /proc, /sys, /dev, a fresh
# /dev/shm and /tmp, and this tree at its own path, so that every mount
# goes and every process left over (a daemon a test did not stop) is killed
# when the run ends. The cached root itself is not written. The inner shell
# does not exec: it stays the namespace's PID 1, which reaps orphans (a
# test's daemon), and the tests run as ordinary processes.
in_root() {
    unshare --mount --pid --fork --propagation private sh -eu -c '
        root=$1; top=$2; shift 2
        mount -t proc proc "$root/proc"
        mount --rbind /sys "$root/sys"
        mount --rbind /dev "$root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        mkdir -p "$root$top"
        mount --bind "$top" "$root$top"
        cd "$root$top"
        chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp \
            LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 "$@"' sh "$root" "$top" "$@"
}

# The C tests (counted by tests/run.sh) and the Python tests, with the
# arm64 daemon. Python must run every test it has (no skip counts here):
# a queue test skipped on aarch64 would be the refusal this run is for.
run_tests() {
    say "running under qemu-aarch64 ($(in_root uname -m))"
    rc=0
    # shellcheck disable=SC2086
    in_root env SHMBROKERD="$build/shmbrokerd" SHMBROKERCTL="$build/shmbrokerctl" \
        SHMB_TEST_TIMEOUT="${SHMB_TEST_TIMEOUT:-900}" \
        sh -c 'cd "$1" && shift && sh tests/run.sh "$@"' sh "$top" "$build" $C_TESTS || rc=1
    say "C tests done ($(elapsed))"
    in_root env SHMBROKERD="$build/shmbrokerd" SHMB_BUILD_DIR="$build" PYTHON=/usr/bin/python3 \
        /usr/bin/python3 "$top/tests/python/run.py" $PY_TESTS >"$build/arm64-python.log" 2>&1 &&
        py=0 || py=1
    cat "$build/arm64-python.log"
    say "Python tests done ($(elapsed))"
    if [ $py -ne 0 ]; then
        rc=1
    elif grep -q '^SKIP: ' "$build/arm64-python.log"; then
        echo "FAIL: arm64 python (a test was skipped under aarch64; every one must run here)"
        rc=1
    fi
    # Grace machines often run kernels of 64 KiB pages: the queue's data
    # path again with qemu reporting that page size (sysconf, mmap.PAGESIZE,
    # AT_PAGESZ). Only what reads the page size is tried so: qemu keeps the
    # host's 4 KiB mapping granularity.
    say "again with 64 KiB pages: $C_TESTS_64K, $PY_TESTS_64K"
    # shellcheck disable=SC2086
    in_root env QEMU_PAGESIZE=65536 SHMBROKERD="$build/shmbrokerd" \
        SHMBROKERCTL="$build/shmbrokerctl" SHMB_TEST_TIMEOUT="${SHMB_TEST_TIMEOUT:-900}" \
        sh -c 'cd "$1" && shift && sh tests/run.sh "$@"' sh "$top" "$build" $C_TESTS_64K || rc=1
    in_root env QEMU_PAGESIZE=65536 SHMBROKERD="$build/shmbrokerd" SHMB_BUILD_DIR="$build" \
        PYTHON=/usr/bin/python3 \
        /usr/bin/python3 -c 'import mmap, sys; sys.exit(mmap.PAGESIZE != 65536)' || {
        echo "FAIL: arm64 64k (qemu did not report 64 KiB pages)"
        rc=1
    }
    in_root env QEMU_PAGESIZE=65536 SHMBROKERD="$build/shmbrokerd" SHMB_BUILD_DIR="$build" \
        PYTHON=/usr/bin/python3 \
        /usr/bin/python3 "$top/tests/python/run.py" $PY_TESTS_64K \
        >"$build/arm64-python-64k.log" 2>&1 &&
        py=0 || py=1
    cat "$build/arm64-python-64k.log"
    if [ $py -ne 0 ] || grep -q '^SKIP: ' "$build/arm64-python-64k.log"; then
        echo "FAIL: arm64 python with 64 KiB pages"
        rc=1
    fi
    say "64 KiB pages done ($(elapsed))"
    return $rc
}

check_host
ensure_binfmt
prepare_root
cross_build
if run_tests; then
    say "PASS ($(elapsed) in all)"
    exit 0
fi
say "FAIL ($(elapsed) in all)"
exit 1
