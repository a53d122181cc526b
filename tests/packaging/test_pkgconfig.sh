#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# C programs built the ways the docs give: from the tree with build/'s
# uninstalled shmbroker.pc (shared, then static with pkg-config --static),
# and after 'make install' into a temporary PREFIX; and the install's
# ldconfig: run into the live system (no DESTDIR), not into a staging one.
. "$(dirname "$0")/lib.sh"

cat >"$tmp/prog.c" <<'C'
#include <shmbroker.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    shmb_t *c = shmb_new();
    const void *p = NULL;
    size_t n = 0;
    if (!c || shmb_connect(c, argv[1], "pkgconfig-test") < 0 ||
        shmb_put(c, argv[2], "linked", 6, 0) < 0 || shmb_get(c, argv[2], &p, &n) < 0) {
        fprintf(stderr, "prog: %s\n", c ? shmb_errmsg(c) : "out of memory");
        return 1;
    }
    printf("%.*s\n", (int)n, (const char *)p);
    shmb_release(c, argv[2]);
    shmb_close(c);
    return argc > 0 ? 0 : 1;
}
C
start_daemon || { fail "the test daemon did not start"; exit 1; }
tmake "$build/shmbroker.pc" "$build/libshmbroker.so.1" "$build/libshmbroker.a" >"$tmp/make.log" 2>&1 ||
    { cat "$tmp/make.log"; fail "make of the library and build/shmbroker.pc"; exit 1; }

# Built against the tree and run without LD_LIBRARY_PATH.
if flags=$(PKG_CONFIG_PATH="$build" pkg-config --cflags --libs shmbroker) &&
    cc -o "$tmp/shared" "$tmp/prog.c" $flags 2>"$tmp/cc.log" &&
    out=$(env -u LD_LIBRARY_PATH "$tmp/shared" "$tmp/sock" tree-shared) && [ "$out" = linked ] &&
    ldd "$tmp/shared" | grep -q "libshmbroker.so.1 => $build/libshmbroker.so.1"; then
    pass "uninstalled_pc_shared"
else
    cat "$tmp/cc.log"
    fail "uninstalled_pc_shared: PKG_CONFIG_PATH=build cc x.c \$(pkg-config --cflags --libs shmbroker)"
fi

# Static: the library's own needs (jansson) come from Libs.private.
if flags=$(PKG_CONFIG_PATH="$build" pkg-config --static --cflags --libs shmbroker) &&
    cc -static -o "$tmp/static" "$tmp/prog.c" $flags 2>"$tmp/cc.log" &&
    out=$("$tmp/static" "$tmp/sock" tree-static) && [ "$out" = linked ] &&
    ! ldd "$tmp/static" >/dev/null 2>&1; then
    pass "uninstalled_pc_static"
else
    cat "$tmp/cc.log"
    fail "uninstalled_pc_static: cc -static x.c \$(pkg-config --static --cflags --libs shmbroker)"
fi

# make install into a temporary PREFIX, nothing under /etc: ldconfig is a
# stand-in that logs its calls, so the live cache is left alone.
cat >"$tmp/ldconfig" <<'SH'
#!/bin/sh
echo "ldconfig $*" >>"$(dirname "$0")/ldconfig.calls"
SH
chmod +x "$tmp/ldconfig"
p="$tmp/prefix"
if tmake install PREFIX="$p" SYSCONFDIR="$p/etc" LDCONFIG="$tmp/ldconfig" >"$tmp/install.log" 2>&1; then
    if flags=$(PKG_CONFIG_PATH="$p/lib/pkgconfig" pkg-config --cflags --libs shmbroker) &&
        cc -o "$tmp/installed" "$tmp/prog.c" $flags 2>"$tmp/cc.log" &&
        out=$(LD_LIBRARY_PATH="$p/lib" "$tmp/installed" "$tmp/sock" installed) &&
        [ "$out" = linked ] && [ -f "$p/share/man/man3/libshmbroker.3" ]; then
        pass "install_prefix_pc"
    else
        cat "$tmp/cc.log"
        fail "install_prefix_pc: a program built with the installed shmbroker.pc"
    fi
    if [ "$(id -u)" -ne 0 ]; then
        if grep -q "not root: .* not run" "$tmp/install.log" && [ ! -e "$tmp/ldconfig.calls" ]; then
            pass "install_live_ldconfig (not root: said so and did not run it)"
        else
            fail "install_live_ldconfig: as a user, the install should say it leaves ldconfig"
        fi
    elif grep -qx "ldconfig " "$tmp/ldconfig.calls" 2>/dev/null; then
        pass "install_live_ldconfig"
    else
        cat "$tmp/install.log"
        fail "install_live_ldconfig: make install without DESTDIR did not run ldconfig"
    fi
    if grep -q "note: the loader does not search $p/lib" "$tmp/install.log"; then
        pass "install_says_loader_path"
    else
        fail "install_says_loader_path: no hint that the loader does not search $p/lib"
    fi
else
    cat "$tmp/install.log"
    fail "install_prefix_pc: make install PREFIX=$p"
fi

rm -f "$tmp/ldconfig.calls"
if tmake install PREFIX=/usr/local DESTDIR="$tmp/stage" LDCONFIG="$tmp/ldconfig" \
    >"$tmp/install.log" 2>&1 && [ -f "$tmp/stage/usr/local/lib/libshmbroker.so.1" ] &&
    [ ! -e "$tmp/ldconfig.calls" ]; then
    pass "install_destdir_no_ldconfig"
else
    cat "$tmp/install.log"
    fail "install_destdir_no_ldconfig: a DESTDIR install ran ldconfig or failed"
fi

[ "$fails" -eq 0 ]
