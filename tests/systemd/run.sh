#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The units under a real systemd: boot a minimal Debian with systemd as PID 1
# in a container (systemd-nspawn), install shmbroker into it the way an
# operator would, and run a check script inside. One test program for
# tests/run.sh: it prints the inside scripts' "PASS: name" / "FAIL: name" /
# "SKIP: name (reason)" lines, or "SKIP: systemd (reason)" when this host
# cannot boot a container (not root, no systemd-nspawn, overlayfs or
# debootstrap, no Debian mirror).
#
# Scenarios, each in a fresh overlay of one cached root:
#   install  `make install PREFIX=/usr/local DESTDIR=<root>`, then
#            checks-install.sh (README's "Run under systemd", line by line)
#   deb      only when debian/ exists: `make deb`, deb-bump.sh for an upgrade
#            set, then checks-deb.sh (install, upgrade, remove, purge)
# SHMB_SYSTEMD_SCENARIOS="install deb" picks them.
#
# The cached root (debootstrap --variant=minbase of bookworm, plus systemd
# and the daemon's runtime libraries, without procps: the units must not need
# it) lives in $SHMB_SYSTEMD_ROOT/<key> (default /var/tmp/shmbroker-systemd-
# root); the key changes with the suite and the package list. Building it
# takes about a minute; a warm run boots in about a second.
#
# What a container cannot show: it shares the host's kernel, its cgroup
# controllers are not delegated (resource limits are not enforced), and its
# PID 1 cannot raise RLIMIT_NOFILE above what it inherits. The check scripts
# say SKIP for what depends on those.

here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

SUITE=bookworm
# The root's packages: systemd as PID 1 and what the installed binaries
# load. python3 for the Python package that `make install` adds.
PACKAGES="systemd systemd-sysv dbus libuv1 libjansson4 python3"
CACHE="${SHMB_SYSTEMD_ROOT:-/var/tmp/shmbroker-systemd-root}"
SCENARIOS="${SHMB_SYSTEMD_SCENARIOS:-install deb}"
BOOT_SECONDS=120
# One check script's time: enough for restarts and timeouts, short of
# tests/run.sh's limit for this program.
CHECK_SECONDS=240
# Where the check scripts are copied inside the container.
IN_DIR=/shmb-tests
PATH_IN=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The current scenario's run: its directory, mount and processes. Only these
# pids are ever signalled.
run_dir=""
mounted=0
nspawn_pid=""
leader=""
check_pid=""
failed=0

# Seconds since this program started, for the log.
t0=$(date +%s)
elapsed() {
    echo "$(($(date +%s) - t0))s"
}

say() {
    echo "systemd: $*"
}

# The whole program cannot run here: one SKIP line says why, exit 0.
skip_all() {
    echo "SKIP: systemd ($*)"
    exit 0
}

# ---- the host ---------------------------------------------------------------

# Root, the container tools and overlayfs, installing missing tools through
# the project's dependency script (which `make test` has usually run).
check_host() {
    [ "$(id -u)" -eq 0 ] || skip_all "needs root to boot a container"
    if ! command -v systemd-nspawn >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
        sh "$top/scripts/install-deps.sh" test >&2 ||
            skip_all "systemd-nspawn or debootstrap missing and cannot be installed"
    fi
    for tool in systemd-nspawn debootstrap nsenter flock; do
        command -v "$tool" >/dev/null 2>&1 || skip_all "$tool not found"
    done
    grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
        skip_all "overlayfs is not available"
}

# host_mirror: the Debian mirror this host's apt already uses.
. "$here/../support/host_mirror.sh"

# ---- the cached root --------------------------------------------------------

# Build the root once (under a lock: several runs may start at once) and set
# $base to it. A root is complete only once renamed into place.
prepare_root() {
    key=$(printf '%s\n%s\n' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
    base="$CACHE/$SUITE-$key"
    mkdir -p "$CACHE/runs" || skip_all "cannot create $CACHE"
    exec 8>"$CACHE/lock"
    flock 8
    if [ ! -f "$base/.shmb-root" ]; then
        mirror=$(host_mirror)
        [ -n "$mirror" ] || skip_all "no Debian mirror in /etc/apt to debootstrap from"
        say "building the cached root $base (about a minute)"
        rm -rf "$base.new"
        include=$(echo "$PACKAGES" | tr ' ' ',')
        if ! debootstrap --variant=minbase --include="$include" "$SUITE" "$base.new" \
            "$mirror" >"$CACHE/debootstrap.log" 2>&1; then
            tail -n 5 "$CACHE/debootstrap.log" | sed 's/^/  | /'
            rm -rf "$base.new"
            flock -u 8
            skip_all "debootstrap of $SUITE from $mirror failed"
        fi
        tune_root "$base.new"
        echo "$PACKAGES" >"$base.new/.shmb-root"
        mv "$base.new" "$base"
        say "cached root ready ($(elapsed))"
    fi
    flock -u 8
    exec 8>&-
}

# Make a fresh debootstrap fit for booting as a throwaway box.
tune_root() {
    rm -f "$1"/var/cache/apt/archives/*.deb
    echo shmb-systemd >"$1/etc/hostname"
    # nspawn hands each boot its own machine id into an empty file.
    : >"$1/etc/machine-id"
    # Timers and gettys that only add noise or reach for the network.
    for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer \
        e2scrub_reap.service console-getty.service systemd-networkd-wait-online.service; do
        ln -sf /dev/null "$1/etc/systemd/system/$u"
    done
}

# ---- one scenario's container -----------------------------------------------

# Stop the container a run killed without its cleanup left behind (the
# timeout's SIGKILL), by the pids it recorded, if they are still its own.
reap_stale_runs() {
    for d in "$CACHE"/runs/run.*; do
        [ -d "$d" ] || continue
        owner=$(cat "$d/owner.pid" 2>/dev/null)
        [ -n "$owner" ] && kill -0 "$owner" 2>/dev/null && continue
        n=$(cat "$d/nspawn.pid" 2>/dev/null)
        if [ -n "$n" ] && tr '\0' ' ' <"/proc/$n/cmdline" 2>/dev/null | grep -qF -- "$d/root"; then
            say "stopping a container a killed run left ($d)"
            kill -KILL "$n" 2>/dev/null
            sleep 1
        fi
        mountpoint -q "$d/root" && { umount "$d/root" 2>/dev/null || umount -l "$d/root"; }
        rm -rf "$d"
    done
}

# A fresh overlay of the cached root: changes go to the run's upper layer.
start_overlay() {
    run_dir=$(mktemp -d "$CACHE/runs/run.XXXXXX") || return 1
    echo $$ >"$run_dir/owner.pid"
    root="$run_dir/root"
    mkdir -p "$run_dir/upper" "$run_dir/work" "$root"
    mount -t overlay shmb-systemd \
        -o "lowerdir=$base,upperdir=$run_dir/upper,workdir=$run_dir/work" "$root" || return 1
    mounted=1
    # The check scripts, and the lib they source, beside each other.
    mkdir -p "$root$IN_DIR"
    cp "$here"/*.sh "$root$IN_DIR/"
}

# Boot the overlay with systemd as PID 1 and wait until it is up; sets
# $leader (the container's PID 1 as the host sees it).
boot() {
    # nspawn drops CAP_SYS_RESOURCE, so the container cannot raise the hard
    # RLIMIT_NOFILE it inherits: give it systemd's usual ceiling to start
    # with, so the unit's LimitNOFILE= applies as on a real host.
    ulimit -Hn 524288 2>/dev/null || say "hard RLIMIT_NOFILE stays $(ulimit -Hn)"
    # --register=no --keep-unit: the host has no system bus or machined.
    systemd-nspawn -q -D "$root" --register=no --keep-unit -M "shmb-$$" \
        --boot --console=read-only >"$run_dir/console.log" 2>&1 </dev/null &
    nspawn_pid=$!
    echo "$nspawn_pid" >"$run_dir/nspawn.pid"
    find_leader || return 1
    state=""
    deadline=$(($(date +%s) + BOOT_SECONDS))
    while :; do
        state=$(in_box timeout 10 systemctl is-system-running --wait 2>/dev/null)
        case "$state" in running | degraded) break ;; esac
        kill -0 "$nspawn_pid" 2>/dev/null || return 1
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
    say "booted, state $state ($(elapsed))"
    if [ "$state" = degraded ]; then
        in_box systemctl --failed --no-pager --no-legend | sed 's/^/  | /'
    fi
    return 0
}

# The container's PID 1 is the nspawn's child named systemd in another pid
# namespace; wait for it to exist.
find_leader() {
    self_ns=$(readlink /proc/self/ns/pid)
    deadline=$(($(date +%s) + BOOT_SECONDS))
    while [ -z "$leader" ]; do
        kill -0 "$nspawn_pid" 2>/dev/null || return 1
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        for c in $(cat /proc/"$nspawn_pid"/task/*/children 2>/dev/null); do
            if [ "$(cat "/proc/$c/comm" 2>/dev/null)" = systemd ] &&
                [ "$(readlink "/proc/$c/ns/pid")" != "$self_ns" ]; then
                leader=$c
            fi
        done
        [ -n "$leader" ] || sleep 0.1
    done
    echo "$leader" >"$run_dir/leader.pid"
}

# in_box CMD...: run CMD as root inside the booted container, with a clean
# environment.
in_box() {
    nsenter -t "$leader" -a -r -w -- env -i PATH="$PATH_IN" HOME=/root LANG=C.UTF-8 \
        SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}

# run_checks SCRIPT: run a check script inside, its output on ours. In the
# background so that a signal to this program runs the teardown at once; the
# nsenter itself (not a subshell around it) so that $check_pid is the process
# the teardown must end.
run_checks() {
    nsenter -t "$leader" -a -r -w -- env -i PATH="$PATH_IN" HOME=/root LANG=C.UTF-8 \
        SYSTEMD_PAGER= SYSTEMD_COLORS=0 \
        timeout "$CHECK_SECONDS" sh -c "cd / && exec sh $IN_DIR/$1" </dev/null &
    check_pid=$!
    wait "$check_pid"
    rc=$?
    check_pid=""
    if [ "$rc" -ne 0 ]; then
        failed=1
        # The units' journal says what the failed checks could not.
        say "$1 exited $rc; the units' journal:"
        in_box journalctl --no-pager -o short-monotonic -u shmbrokerd.service \
            -u shmbrokerd.socket 2>&1 | tail -n 60 | sed 's/^/  | /'
    fi
    return "$rc"
}

# Power the container off and remove the overlay. Runs on every exit path;
# signals only the processes this run started.
teardown() {
    if [ -n "$check_pid" ] && kill -0 "$check_pid" 2>/dev/null; then
        # An unfinished check: left alone, its nsenter would be stopped by
        # the container's shutdown (outside the container, never continued)
        # and, not reaping its child, hold the poweroff up.
        kill -KILL "$check_pid" 2>/dev/null
        wait "$check_pid" 2>/dev/null
    fi
    check_pid=""
    if [ -n "$nspawn_pid" ] && kill -0 "$nspawn_pid" 2>/dev/null; then
        if [ -n "$leader" ]; then
            in_box systemctl poweroff --no-block >/dev/null 2>&1 ||
                kill -TERM "$nspawn_pid" 2>/dev/null
        else
            kill -TERM "$nspawn_pid" 2>/dev/null # nspawn asks its PID 1 to stop
        fi
        tries=300
        while [ "$tries" -gt 0 ] && kill -0 "$nspawn_pid" 2>/dev/null; do
            sleep 0.1
            tries=$((tries - 1))
        done
        if kill -0 "$nspawn_pid" 2>/dev/null; then
            say "the container did not power off in 30 s; killing it"
            [ -n "$leader" ] && kill -KILL "$leader" 2>/dev/null
            sleep 1
            kill -KILL "$nspawn_pid" 2>/dev/null
        fi
        wait "$nspawn_pid" 2>/dev/null
    fi
    nspawn_pid=""
    leader=""
    if [ "$mounted" = 1 ]; then
        umount "$root" 2>/dev/null || umount -l "$root" || say "cannot unmount $root"
        mounted=0
    fi
    [ -n "$run_dir" ] && rm -rf "$run_dir"
    run_dir=""
}

# A scenario from overlay to poweroff. Stage (a function) prepares the root
# before boot; a stage or boot that fails is one FAIL line for the scenario.
scenario() {
    name=$1
    stage=$2
    script=$3
    say "scenario $name ($(elapsed))"
    if ! start_overlay; then
        echo "FAIL: $name: cannot mount an overlay of the cached root"
        failed=1
    elif ! "$stage"; then
        echo "FAIL: $name: preparing the root failed"
        failed=1
    elif ! boot; then
        tail -n 20 "$run_dir/console.log" 2>/dev/null | sed 's/^/  | /'
        teardown
        skip_all "systemd-nspawn cannot boot a container here (console above)"
    else
        run_checks "$script"
    fi
    teardown
    say "scenario $name done ($(elapsed))"
}

# ---- the scenarios ------------------------------------------------------------

# README's first line, staged into the container's root: the host builds
# (with the repository's usual build directory) and installs.
stage_install() {
    make -s -C "$top" install PREFIX=/usr/local DESTDIR="$root" >"$run_dir/install.log" 2>&1 ||
        { tail -n 20 "$run_dir/install.log" | sed 's/^/  | /'; return 1; }
}

# The package set twice, the second with a higher version, copied in for
# checks-deb.sh to install, upgrade, remove and purge.
stage_deb() {
    out="$run_dir/debs"
    mkdir -p "$out/old" "$out/new" "$root/debs"
    make -s -C "$top" deb DEB_OUT="$out/old" >"$run_dir/deb.log" 2>&1 &&
        sh "$top/tests/systemd/deb-bump.sh" "$out/old" "$out/new" >>"$run_dir/deb.log" 2>&1 ||
        { tail -n 20 "$run_dir/deb.log" | sed 's/^/  | /'; return 1; }
    cp -r "$out/old" "$out/new" "$root/debs/"
}

# Every exit, normal or by a signal, powers the container off first.
on_exit() {
    trap - EXIT INT TERM
    teardown
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

check_host
prepare_root
reap_stale_runs
for s in $SCENARIOS; do
    case "$s" in
    install) scenario install stage_install checks-install.sh ;;
    deb)
        if [ -d "$top/debian" ]; then
            scenario deb stage_deb checks-deb.sh
        else
            echo "SKIP: deb (no debian/ directory in this tree)"
        fi
        ;;
    *) echo "FAIL: $s: no such scenario" && failed=1 ;;
    esac
done
say "done ($(elapsed))"
exit "$failed"
