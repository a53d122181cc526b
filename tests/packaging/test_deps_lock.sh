#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# scripts/install-deps.sh (which 'make deb', 'make' and 'make test' run)
# waits for the dpkg lock that another apt holds instead of failing: every
# apt-get it runs carries -o DPkg::Lock::Timeout. apt-get, dpkg-query and
# sudo are stand-ins here that log their calls and say nothing is installed.
. "$(dirname "$0")/lib.sh"

mkdir -p "$tmp/bin"
cat >"$tmp/bin/apt-get" <<'SH'
#!/bin/sh
echo "apt-get $*" >>"$(dirname "$0")/calls"
# The first install fails, as with a stale package list: the update and
# the second install must wait for the lock too.
if [ "$*" = "${*%install*}" ] || [ -e "$(dirname "$0")/updated" ]; then
    touch "$(dirname "$0")/updated"
    exit 0
fi
exit 100
SH
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/dpkg-query"
printf '#!/bin/sh\nexec "$@"\n' >"$tmp/bin/sudo"
chmod +x "$tmp/bin/apt-get" "$tmp/bin/dpkg-query" "$tmp/bin/sudo"

if PATH="$tmp/bin:$PATH" sh "$root/scripts/install-deps.sh" deb >"$tmp/out" 2>&1; then
    n=$(grep -c '^apt-get ' "$tmp/bin/calls")
    waiting=$(grep -c '^apt-get -o DPkg::Lock::Timeout=600 ' "$tmp/bin/calls")
    if [ "$n" -eq 3 ] && [ "$waiting" -eq 3 ]; then
        pass "apt_waits_for_lock (install, update, install)"
    else
        cat "$tmp/bin/calls"
        fail "apt_waits_for_lock: $waiting of $n apt-get calls carry -o DPkg::Lock::Timeout=600"
    fi
else
    cat "$tmp/out"
    fail "apt_waits_for_lock: install-deps.sh deb failed with stand-in apt-get"
fi

rm -f "$tmp/bin/calls" "$tmp/bin/updated"
if PATH="$tmp/bin:$PATH" SHMB_APT_LOCK_TIMEOUT=30 sh "$root/scripts/install-deps.sh" deb \
    >"$tmp/out" 2>&1 && grep -q '^apt-get -o DPkg::Lock::Timeout=30 install' "$tmp/bin/calls"; then
    pass "apt_lock_timeout_setting"
else
    cat "$tmp/out" "$tmp/bin/calls"
    fail "apt_lock_timeout_setting: SHMB_APT_LOCK_TIMEOUT=30 not passed to apt-get"
fi

rm -f "$tmp/bin/calls"
if ! PATH="$tmp/bin:$PATH" SHMB_APT_LOCK_TIMEOUT=-5 sh "$root/scripts/install-deps.sh" deb \
    >"$tmp/out" 2>&1 && grep -q "SHMB_APT_LOCK_TIMEOUT must be a number of seconds, not '-5'" "$tmp/out" &&
    [ ! -e "$tmp/bin/calls" ]; then
    pass "apt_lock_timeout_refused"
else
    cat "$tmp/out"
    fail "apt_lock_timeout_refused: SHMB_APT_LOCK_TIMEOUT=-5 was not refused before apt-get"
fi

# apt-get update's lock (the package lists') is not DPkg::Lock::Timeout's:
# the script tries again while apt says another holds it.
cat >"$tmp/bin/apt-get" <<'SH'
#!/bin/sh
d=$(dirname "$0")
echo "apt-get $*" >>"$d/calls"
case "$*" in
*update*)
    n=$(grep -c update "$d/calls")
    if [ "$n" -le "$(cat "$d/busy")" ]; then
        echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)" >&2
        exit 100
    fi
    touch "$d/updated"
    exit 0 ;;
esac
[ -e "$d/updated" ] || exit 100
SH
rm -f "$tmp/bin/calls" "$tmp/bin/updated"
echo 1 >"$tmp/bin/busy"
if PATH="$tmp/bin:$PATH" sh "$root/scripts/install-deps.sh" deb >"$tmp/out" 2>&1 &&
    [ "$(grep -c update "$tmp/bin/calls")" -eq 2 ] && [ "$(grep -c install "$tmp/bin/calls")" -eq 2 ]; then
    pass "apt_update_waits_for_lists_lock"
else
    cat "$tmp/out" "$tmp/bin/calls"
    fail "apt_update_waits_for_lists_lock: the update was not tried again after 'Could not get lock'"
fi

rm -f "$tmp/bin/calls" "$tmp/bin/updated"
echo 1000 >"$tmp/bin/busy"
if ! PATH="$tmp/bin:$PATH" SHMB_APT_LOCK_TIMEOUT=3 sh "$root/scripts/install-deps.sh" deb \
    >"$tmp/out" 2>&1 && grep -q "held the package lists' lock for 3 s" "$tmp/out" &&
    [ "$(grep -c update "$tmp/bin/calls")" -eq 2 ]; then
    pass "apt_update_lock_gives_up"
else
    cat "$tmp/out" "$tmp/bin/calls"
    fail "apt_update_lock_gives_up: with SHMB_APT_LOCK_TIMEOUT=3 the update should give up after 3 s"
fi

# README's venv route starts with 'make wheel': on a fresh Debian 12 (a
# container's debian:12 has no python3, a cloud image no python3-venv) it
# installs what the wheel and 'python3 -m venv' need, as 'make' does for
# the build. (dpkg-query here says nothing is installed.)
rm -f "$tmp/bin/calls" "$tmp/bin/updated" "$tmp/bin/busy"
if PATH="$tmp/bin:$PATH" tmake wheel >"$tmp/out" 2>&1 &&
    grep -q '^apt-get .* install .*python3-venv' "$tmp/bin/calls" &&
    ! grep -q "is up to date" "$tmp/out"; then
    pass "make_wheel_installs_venv"
else
    cat "$tmp/out" "$tmp/bin/calls"
    fail "make_wheel_installs_venv: make wheel did not install python3-venv (or printed make's noise)"
fi

# A user with neither root nor sudo still gets the wheel (it needs python3
# alone; the venv is the user's to make elsewhere): told what to install,
# not stopped. A PATH of its own, so that no real sudo or apt-get is found.
mkdir -p "$tmp/nosudo"
printf '#!/bin/sh\necho 1000\n' >"$tmp/nosudo/id"
cp "$tmp/bin/dpkg-query" "$tmp/nosudo/dpkg-query"
chmod +x "$tmp/nosudo/id"
for c in sh grep python3 make; do
    ln -sf "$(command -v "$c")" "$tmp/nosudo/$c"
done
if PATH="$tmp/nosudo" sh "$root/scripts/install-deps.sh" wheel >"$tmp/out" 2>&1 &&
    grep -q "install them by hand: apt-get install python3-venv" "$tmp/out"; then
    pass "wheel_deps_without_sudo"
else
    cat "$tmp/out"
    fail "wheel_deps_without_sudo: install-deps.sh wheel stopped a user without sudo"
fi

[ "$fails" -eq 0 ]
