# SPDX-License-Identifier: Apache-2.0
# shmbroker: plain GNU make.
#   make            build the daemon, the library and the ctl tool
#   make run        install missing packages, build, start the daemon in the foreground
#                   (its flags in RUN_ARGS='--size 1G ...')
#   make wheel      the Python package as build/dist/shmbroker-VERSION-py3-none-any.whl
#   make test       install missing packages, build, run every test
#   make install    PREFIX=/usr/local DESTDIR= (settings files go in SYSCONFDIR=/etc)
#   make deb        Debian packages in DEB_OUT (default build/deb)
#   make man3       write client/libshmbroker.3 again from client/shmbroker.h
#   make clean
# Switches: SANITIZER=address|undefined|thread (own build directory), V=1 (show commands).

.DEFAULT_GOAL := all
VERSION     := 0.1.0
PREFIX      ?= /usr/local
DESTDIR     ?=
BINDIR      ?= $(PREFIX)/bin
SBINDIR     ?= $(PREFIX)/sbin
LIBDIR      ?= $(PREFIX)/lib
INCLUDEDIR  ?= $(PREFIX)/include
MANDIR      ?= $(PREFIX)/share/man
UNITDIR     ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
# The daemon's settings files (shmbrokerd.conf, default/shmbrokerd) are where
# systemd units and operators look for them, whatever the PREFIX.
SYSCONFDIR  ?= /etc
# The Python package goes where the system's python3 finds it: Debian's
# dist-packages under PREFIX (for /usr/local, /usr/local/lib/python3.X/dist-packages).
# The system's python3 is Debian's /usr/bin/python3, the one apt installs
# numpy and redis-py for, even when another python3 comes first in PATH.
PYTHON      ?= $(firstword $(wildcard /usr/bin/python3) python3)
PY_VERSION  := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
PYTHONDIR   ?= $(PREFIX)/lib/python$(PY_VERSION)/dist-packages
# The package's metadata directory (PEP 376), for its entry points.
PY_DISTINFO := shmbroker-$(VERSION).dist-info
CC          ?= cc
# The linker, objcopy and ar of CC's target (make's defaults are the host's):
# tests/arm64/run.sh sets the aarch64-linux-gnu- ones for its cross build.
OBJCOPY     ?= objcopy
SANITIZER   ?=
OPT         ?= -O2

ifeq ($(SANITIZER),)
BUILD       ?= build
SANFLAGS    :=
else ifeq ($(SANITIZER),address)
BUILD       ?= build-address
SANFLAGS    := -fsanitize=address -fno-omit-frame-pointer
else ifeq ($(SANITIZER),undefined)
BUILD       ?= build-undefined
SANFLAGS    := -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else ifeq ($(SANITIZER),thread)
BUILD       ?= build-thread
SANFLAGS    := -fsanitize=thread -fno-omit-frame-pointer
else
$(error SANITIZER must be address, undefined or thread, not '$(SANITIZER)')
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# pkg-config is asked only when a goal compiles something, so that
# 'make clean' works on a machine without the packages.
PKGS_CFLAGS  = $(shell pkg-config --cflags libuv jansson 2>/dev/null)
PKGS_LIBS    = $(shell pkg-config --libs libuv jansson 2>/dev/null)
CMOCKA_LIBS  = $(shell pkg-config --libs cmocka 2>/dev/null)

WARN     := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
            -Wpointer-arith -Wformat=2 -Wno-format-nonliteral
CFLAGS   ?= $(OPT) -g
ALLCFLAGS = -std=c11 -D_GNU_SOURCE -DSHMB_VERSION='"$(VERSION)"' -fPIC $(WARN) \
            $(SANFLAGS) $(CFLAGS) $(PKGS_CFLAGS) -Iproto -Idaemon -Iclient \
            -Itests/support -MMD -MP
ALLLDFLAGS = $(SANFLAGS) $(LDFLAGS)

# ---- sources ------------------------------------------------------------
PROTO_SRC   := proto/utf8.c proto/error.c proto/alloc.c proto/text.c proto/protocol.c proto/line.c proto/sock.c \
               proto/starting.c \
               proto/frames.c proto/queue.c proto/names.c
# The store and its rooms (keys, reads, reclaim, arenas, adoption).
STORE_SRC   := daemon/store.c daemon/keys.c daemon/reads.c daemon/reclaim.c daemon/arenas.c \
               daemon/adopt.c
# The ring: positions and slots, and the walk over the chunks in the file.
RING_SRC    := daemon/ring.c daemon/ring_walk.c
CORE_SRC    := daemon/segment.c $(RING_SRC) daemon/index.c $(STORE_SRC) daemon/catalog.c
# Arenas: puts in one round trip (the store's arena objects).
CORE_SRC    += daemon/arena.c
# The segment and its rooms: what a test that links the segment links.
SEGMENT_SRC := daemon/segment.c daemon/space.c daemon/lock.c daemon/memfd.c daemon/orphan.c \
               daemon/guard.c
CORE_SRC    += $(filter-out daemon/segment.c,$(SEGMENT_SRC))
# The flags: values and the --config file, the --pool values, the handlers.
CONFIG_SRC  := daemon/config.c daemon/config_pool.c daemon/config_flags.c
# The op table and its handlers by family, on the call they share.
COMMAND_SRC := daemon/command.c daemon/cmd_call.c daemon/cmd_objects.c daemon/cmd_arenas.c \
               daemon/cmd_queues.c daemon/cmd_reports.c
# One connection: the set and its opening, the turns, what both stand on.
CONN_SRC    := daemon/conn.c daemon/conn_turn.c daemon/conn_base.c
# The queues and their rooms: the overflow objects, the pages made off the loop.
QUEUE_SRC   := daemon/queue.c daemon/queue_overflow.c daemon/queue_job.c
DAEMON_SRC  := daemon/main.c $(CONFIG_SRC) daemon/log.c daemon/notify.c daemon/server.c \
               daemon/listener.c $(CONN_SRC) daemon/waitq.c $(COMMAND_SRC) daemon/host.c \
               daemon/sizing.c daemon/pool.c $(QUEUE_SRC) daemon/held.c $(CORE_SRC)
# main.c's rooms: the pools' plan, the reload, the descriptor store.
DAEMON_SRC  += daemon/plan.c daemon/reload.c daemon/keep.c daemon/hup.c
LIB_SRC     := client/client.c client/connect.c client/objects.c client/many.c client/report.c client/frames.c \
               client/queue.c client/queue_wait.c client/queue_overflow.c client/read.c client/arena.c
# Objects from other hosts, through shmbroker-relay (relay/).
LIB_SRC     += client/fetch.c
# report.c's rooms: the queues' report, a segment file read without the daemon.
LIB_SRC     += client/report_queue.c client/report_segment.c
CTL_SRC     := client/shmbrokerctl.c
# The ctl's rooms: what its commands share, then the commands by family.
CTL_SRC     += client/ctl.c client/ctl_status.c client/ctl_human.c client/ctl_prom.c \
               client/ctl_segment.c client/ctl_objects.c client/ctl_admin.c
# The catalog's reader, for the library and the daemon's tests.
PROTO_SRC   += proto/catalog.c

OBJ = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

PROTO_OBJ := $(call OBJ,$(PROTO_SRC))
# error, alloc, text and the catalog's hash: what the core modules need,
# without jansson.
BASE_OBJ  := $(call OBJ,proto/utf8.c proto/error.c proto/alloc.c proto/text.c proto/catalog.c)
CORE_OBJ  := $(call OBJ,$(CORE_SRC))

DAEMON    := $(BUILD)/shmbrokerd
CTL       := $(BUILD)/shmbrokerctl
LIB_SONAME := libshmbroker.so.1
LIB_A     := $(BUILD)/libshmbroker.a
LIB_SO    := $(BUILD)/$(LIB_SONAME)
EXAMPLE   := $(BUILD)/example
QUEUE_EXAMPLE := $(BUILD)/example-queue
BINS      := $(DAEMON) $(CTL) $(LIB_A) $(LIB_SO) $(EXAMPLE) $(QUEUE_EXAMPLE)

UNIT_TESTS := test_ring test_store test_segment test_index test_chaos test_line test_error \
              test_text test_conn test_tables test_command test_config_parse test_client \
              test_frames_layout test_host test_pool test_queue test_daemon_queue \
              test_catalog test_names
UNIT_BINS  := $(addprefix $(BUILD)/tests/,$(UNIT_TESTS))

# Each unit test links only the module under test and what it needs.
$(BUILD)/tests/test_ring:    $(call OBJ,tests/unit/test_ring.c $(RING_SRC) $(SEGMENT_SRC)) $(BASE_OBJ)
$(BUILD)/tests/test_index:   $(call OBJ,tests/unit/test_index.c daemon/index.c) $(BASE_OBJ)
$(BUILD)/tests/test_store:   $(call OBJ,tests/unit/test_store.c $(STORE_SRC) $(RING_SRC) daemon/index.c $(SEGMENT_SRC) daemon/catalog.c) $(BASE_OBJ)
# --wrap=catalog_add: what a reader in place finds while an entry is listed.
$(BUILD)/tests/test_store: TEST_LDFLAGS := -Wl,--wrap=catalog_add
# The catalog's writer over a plain buffer, read back as a reader would.
$(BUILD)/tests/test_catalog: $(call OBJ,tests/unit/test_catalog.c daemon/catalog.c $(SEGMENT_SRC)) $(BASE_OBJ)
$(BUILD)/tests/test_segment: $(call OBJ,tests/unit/test_segment.c $(SEGMENT_SRC)) $(BASE_OBJ)
$(BUILD)/tests/test_segment: TEST_LDFLAGS := -Wl,--wrap=statvfs,--wrap=statfs,--wrap=fopen,--wrap=posix_fallocate
# The command layer without sockets: the chaos test and the fuzzer drive it.
COMMAND_OBJ := $(call OBJ,$(COMMAND_SRC) daemon/pool.c $(QUEUE_SRC) $(CONFIG_SRC) \
               daemon/host.c daemon/log.c \
               tests/support/fixture.c \
               $(CORE_SRC)) $(PROTO_OBJ)
$(BUILD)/tests/test_chaos:   $(call OBJ,tests/unit/test_chaos.c) $(COMMAND_OBJ)
$(BUILD)/tests/test_chaos: TEST_LDFLAGS = $(PKGS_LIBS)
$(BUILD)/tests/test_command: $(call OBJ,tests/unit/test_command.c) $(COMMAND_OBJ)
$(BUILD)/tests/test_command: TEST_LDFLAGS = $(PKGS_LIBS)
$(BUILD)/tests/test_line:    $(call OBJ,tests/unit/test_line.c proto/line.c) $(BASE_OBJ)
$(BUILD)/tests/test_line: TEST_LDFLAGS = $(PKGS_LIBS)
$(BUILD)/tests/test_error:   $(call OBJ,tests/unit/test_error.c) $(BASE_OBJ)
$(BUILD)/tests/test_error: TEST_LDFLAGS = $(PKGS_LIBS)
$(BUILD)/tests/test_text:    $(call OBJ,tests/unit/test_text.c) $(BASE_OBJ)
# Pool and queue names and the overflow key, shared by daemon and library.
$(BUILD)/tests/test_names:   $(call OBJ,tests/unit/test_names.c proto/names.c) $(BASE_OBJ)
# The frames layout: arithmetic, writer and reader, over plain buffers.
$(BUILD)/tests/test_frames_layout: $(call OBJ,tests/unit/test_frames_layout.c proto/frames.c) $(BASE_OBJ)
# The catalog's reader (proto/catalog.c) over a segment built by hand.
UNIT_BINS += $(BUILD)/tests/test_catalog_read
$(BUILD)/tests/test_catalog_read: $(call OBJ,tests/unit/test_catalog_read.c proto/catalog.c)
# The queue's data path over a memfd, with forked writers and readers.
$(BUILD)/tests/test_queue: $(call OBJ,tests/unit/test_queue.c proto/queue.c) $(BASE_OBJ)
$(BUILD)/tests/test_queue: TEST_LDFLAGS := -lpthread
# Connections, the wait queue and the listener over a real loop and socketpairs.
$(BUILD)/tests/test_conn:    $(call OBJ,tests/unit/test_conn.c $(CONN_SRC) daemon/waitq.c \
                              daemon/server.c daemon/listener.c) $(COMMAND_OBJ)
$(BUILD)/tests/test_conn: TEST_LDFLAGS = $(PKGS_LIBS)
# PROTOCOL.md against proto/ops.def and proto/errors.def.
$(BUILD)/tests/test_tables:  $(call OBJ,tests/unit/test_tables.c) $(PROTO_OBJ)
$(BUILD)/tests/test_tables: TEST_LDFLAGS = $(PKGS_LIBS)
# The flag parser: config and what it asks (the log level, the segment's and
# the store's sizes for the default max object size).
$(BUILD)/tests/test_config_parse: $(call OBJ,tests/unit/test_config_parse.c $(CONFIG_SRC) \
                                  daemon/log.c) $(CORE_OBJ) $(PROTO_OBJ)
$(BUILD)/tests/test_config_parse: TEST_LDFLAGS = $(PKGS_LIBS)
# Host facts over fake /proc and /sys trees; the fixes sizing prints.
$(BUILD)/tests/test_host:    $(call OBJ,tests/unit/test_host.c daemon/host.c daemon/sizing.c \
                              $(SEGMENT_SRC)) $(BASE_OBJ)
# Pools over a real tmpfs: the summed space check, adoption, memfd, access.
$(BUILD)/tests/test_pool:    $(call OBJ,tests/unit/test_pool.c daemon/pool.c daemon/host.c \
                              daemon/log.c) $(CORE_OBJ) $(PROTO_OBJ)
$(BUILD)/tests/test_pool: TEST_LDFLAGS = $(PKGS_LIBS)
# The daemon's queues over real memfds and a memfd pool.
$(BUILD)/tests/test_daemon_queue: $(call OBJ,tests/unit/test_daemon_queue.c $(QUEUE_SRC) \
                                  daemon/pool.c $(CONFIG_SRC) daemon/host.c daemon/log.c) \
                                  $(CORE_OBJ) $(PROTO_OBJ)
# The store's lookups by key that the queues make (queue_overflow.c) are
# counted (the cost of a seat's departure); store_forgo_reads is weak on the
# test's side.
$(BUILD)/tests/test_daemon_queue: TEST_LDFLAGS = $(PKGS_LIBS) \
    -Wl,--wrap=store_forgo_read,--wrap=store_forgo_reads,--wrap=store_holder_pins
# The library against a fake daemon: a thread on a temporary socket.
$(BUILD)/tests/test_client:  $(call OBJ,tests/unit/test_client.c $(LIB_SRC)) $(PROTO_OBJ)
$(BUILD)/tests/test_client: TEST_LDFLAGS = $(PKGS_LIBS) -lpthread \
    -Wl,--wrap=shmb_key_len_check,--wrap=shmb_key_check

# End-to-end tests drive the real binaries through the library and raw sockets.
E2E_TESTS := test_protocol test_clients test_ctl test_reliability test_batch test_systemd \
             test_bounds test_startup test_adopt \
             test_ids test_many test_ctl_output test_hostile_rw test_idle test_config \
             test_fork test_threads test_library test_pools \
             soak test_cases test_frames test_sizing test_backings test_queue_ops
# Reads from the catalog and puts through arenas (TEST_LDFLAGS below).
E2E_TESTS += test_read
# shmb_read after shmb_put_nowait on the same handle (--wrap=send below).
E2E_TESTS += test_read_nowait
# Readers of a daemon that stopped serving their segment (the link's
# --wrap=poll counts their looks at the connection, below).
E2E_TESTS += test_liveness
# Broadcast queues through the library: forked writers and readers.
E2E_TESTS += test_queues
# shmbrokerctl status read from the segment's header page.
E2E_TESTS += test_ctl_segment
# Arenas (puts in one round trip): the store's arena objects, a unit program,
# and raw-socket clients against the real daemon.
$(BUILD)/tests/test_store:   $(call OBJ,daemon/arena.c)
UNIT_BINS  += $(BUILD)/tests/test_arena
$(BUILD)/tests/test_arena:   $(call OBJ,tests/unit/test_arena.c daemon/arena.c $(STORE_SRC) \
                              $(RING_SRC) daemon/index.c $(SEGMENT_SRC) daemon/catalog.c) \
                              $(BASE_OBJ)
E2E_TESTS += test_arena_ops
# Queues bounded per pool, their lease, their pages made off the loop.
E2E_TESTS += test_queue_limits
# What an operator meets: the stop after a settings change, the start's words,
# clients in other pid namespaces, a long start.
E2E_TESTS += test_operator
# test_operator's start held mid-reservation (LD_PRELOAD), built without the
# sanitizer: a preloaded library must not bring a second runtime.
SLOW_RESERVE := $(BUILD)/tests/slow_reserve.so
$(SLOW_RESERVE): tests/e2e/slow_reserve.c Makefile
	@mkdir -p $(dir $@)
	$(Q)$(CC) -std=c11 -g -O1 $(WARN) -shared -fPIC -o $@ $< -ldl
$(BUILD)/tests/test_operator: | $(SLOW_RESERVE)
E2E_BINS  := $(addprefix $(BUILD)/tests/,$(E2E_TESTS))
$(E2E_BINS): $(BUILD)/tests/%: $(BUILD)/obj/tests/e2e/%.o $(BUILD)/obj/tests/e2e/harness.o \
              $(BUILD)/obj/tests/e2e/checks.o $(LIB_A)
$(E2E_BINS): TEST_LDFLAGS = $(PKGS_LIBS)
# The frames tool that tests of other clients run against the library
# (not installed); test_frames checks it too.
FRAMES_TOOL := $(BUILD)/tests/shmb-frames-tool
$(FRAMES_TOOL): $(call OBJ,tests/e2e/frames_tool.c) $(LIB_A)
$(FRAMES_TOOL): TEST_LDFLAGS = $(PKGS_LIBS)
$(BUILD)/tests/test_frames: | $(FRAMES_TOOL)
# The reader the Python tests hold Client.read against, row by row of the
# scribble table (tests/scribble/cases): shmb_read on both kinds of handle.
READ_TOOL := $(BUILD)/tests/shmb-read-tool
$(READ_TOOL): $(call OBJ,tests/e2e/read_tool.c) $(LIB_A)
$(READ_TOOL): TEST_LDFLAGS = $(PKGS_LIBS)
# test_read counts the library's send()s to tell its round trips, and its
# mincore()s, its looks at the arena's pages.
$(BUILD)/tests/test_read: TEST_LDFLAGS = $(PKGS_LIBS) -Wl,--wrap=send,--wrap=mincore
$(BUILD)/tests/test_read_nowait: TEST_LDFLAGS = $(PKGS_LIBS) -Wl,--wrap=send
$(BUILD)/tests/test_liveness: TEST_LDFLAGS = $(PKGS_LIBS) -Wl,--wrap=poll

# The soak: 32 clients for SOAK_SECONDS (a short run in 'make test'), and the
# same under valgrind's memcheck for SOAK_VALGRIND_SECONDS.
SOAK_SECONDS          ?= 8
SOAK_VALGRIND_SECONDS ?= 4
export SOAK_SECONDS SOAK_VALGRIND_SECONDS

# Reads without a round trip, proved: the daemon's catalog against the
# readers' copy-out in threads over a private area (reads racing unlisting
# and reuse), also under ThreadSanitizer in the plain build (as
# test_queue_tsan below: x86-64 forgives a missing release, ThreadSanitizer
# does not; every access to the shared area is atomic there, so the fences
# it does not model, -Wtsan, order nothing it checks); and, end to end,
# random operations from forked clients with SIGKILLs and daemon restarts
# (test_model: SHMB_MODEL_SECONDS, SHMB_MODEL_SEED) and a client scribbling
# over the catalog, the header page and the chunks (test_scribble).
UNIT_BINS += $(BUILD)/tests/test_catalog_race
$(BUILD)/tests/test_catalog_race: $(call OBJ,tests/unit/test_catalog_race.c daemon/catalog.c \
                                  proto/catalog.c $(SEGMENT_SRC)) $(BASE_OBJ)
$(BUILD)/tests/test_catalog_race: TEST_LDFLAGS := -lpthread
CATALOG_TSAN_BIN := $(BUILD)/tests/test_catalog_race_tsan
CATALOG_TSAN_SRC := tests/unit/test_catalog_race.c daemon/catalog.c proto/catalog.c \
                    $(SEGMENT_SRC) proto/utf8.c proto/error.c proto/alloc.c proto/text.c
ifeq ($(SANITIZER),)
UNIT_BINS += $(CATALOG_TSAN_BIN)
endif
$(CATALOG_TSAN_BIN): $(CATALOG_TSAN_SRC) $(wildcard proto/*.h daemon/*.h) Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TSAN    $@")
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -Wno-tsan -fsanitize=thread \
	    -fno-omit-frame-pointer -Iproto -Idaemon -o $@ $(CATALOG_TSAN_SRC) -lpthread \
	    $(CMOCKA_LIBS)
PROOF_E2E := $(BUILD)/tests/test_model $(BUILD)/tests/test_scribble
E2E_BINS += $(PROOF_E2E)
$(PROOF_E2E): $(BUILD)/tests/%: $(BUILD)/obj/tests/e2e/%.o $(BUILD)/obj/tests/e2e/harness.o \
              $(BUILD)/obj/tests/e2e/checks.o $(LIB_A)
$(PROOF_E2E): TEST_LDFLAGS = $(PKGS_LIBS)

# The library under ThreadSanitizer: the plain 'make test' also runs
# test_threads (a handle per thread, two threads on one handle) built with it
# from the library's sources, so that a data race in the library fails the
# build's tests. 'make test SANITIZER=thread' builds everything so.
TSAN_BIN := $(BUILD)/tests/test_threads_tsan
TSAN_SRC := tests/e2e/test_threads.c tests/e2e/harness.c tests/e2e/checks.c $(LIB_SRC) \
            $(PROTO_SRC)
# The queue's memory ordering is checked the same way: on x86-64 a slot
# published without release ordering still works, and only ThreadSanitizer,
# watching test_queue's threads, sees the race.
QUEUE_TSAN_BIN := $(BUILD)/tests/test_queue_tsan
QUEUE_TSAN_SRC := tests/unit/test_queue.c proto/queue.c proto/utf8.c proto/error.c \
                  proto/alloc.c proto/text.c

# What 'make test' runs: every unit and end-to-end program, the soak under
# valgrind, and (in the plain build) the fuzzer for FUZZ_SECONDS.
TEST_RUNS := $(UNIT_BINS) $(E2E_BINS) tests/e2e/soak_valgrind.sh tests/e2e/test_run_timeout.sh \
             tests/structure/check_layers.sh tests/structure/test_check_layers.sh \
             tests/structure/check_sizes.sh tests/structure/test_check_sizes.sh \
             tests/structure/check_exports.sh tests/structure/check_spdx.sh tests/python/run.py
ifeq ($(SANITIZER),)
TEST_RUNS += tests/fuzz/run_fuzz.sh tests/fuzz/run_fuzz_adopt.sh
# The units under a real systemd in a container (skipped when not root); it
# installs the plain build, so sanitizer builds leave it out.
TEST_RUNS += tests/systemd/run.sh
endif
ifeq ($(SANITIZER),)
TEST_RUNS += $(TSAN_BIN) $(QUEUE_TSAN_BIN)
endif
# SANITIZER=thread is for the library (the daemon has one thread); three
# programs do not apply to such a build: valgrind cannot run it, test_bounds'
# peak-memory bounds would count its shadow memory, and test_systemd's
# install checks link the installed static library without the sanitizer.
ifeq ($(SANITIZER),thread)
TEST_RUNS := $(filter-out tests/e2e/soak_valgrind.sh $(BUILD)/tests/test_bounds \
               $(BUILD)/tests/test_systemd,$(TEST_RUNS))
endif

# The fuzz target: clang's libFuzzer with ASan and UBSan over the request
# handler. 'make test' runs it briefly; FUZZ_SECONDS=3600 make fuzz runs long.
FUZZ_SECONDS ?= 60
FUZZ_RUNS    ?= 1000000
FUZZ_BUILD   := build-fuzz
FUZZ_SRC     := tests/fuzz/fuzz_command.c tests/support/fixture.c $(COMMAND_SRC) daemon/log.c \
                daemon/pool.c $(QUEUE_SRC) $(CONFIG_SRC) daemon/host.c \
                $(CORE_SRC) $(PROTO_SRC)
FUZZ_BIN     := $(FUZZ_BUILD)/fuzz_command

# The adoption fuzzer: random damage to a segment, a SIGKILL, a restart,
# under ASan and UBSan. 'make test' runs it for FUZZ_ADOPT_SECONDS;
# 'make fuzz-adopt FUZZ_ADOPT_SECONDS=3600' for as long as asked.
FUZZ_ADOPT_SECONDS ?= 30
FUZZ_ADOPT_SRC := tests/fuzz/fuzz_adopt.c $(CORE_SRC) proto/utf8.c proto/error.c proto/alloc.c \
                  proto/text.c proto/catalog.c
FUZZ_ADOPT_BIN := $(FUZZ_BUILD)/fuzz_adopt

.PHONY: all run test test-arm64 fuzz fuzz-adopt soak bench bench-vllm bench-instructions check-deps check-test-deps unit clean install uninstall deb
all: check-deps
	$(Q)$(MAKE) --no-print-directory binaries

check-deps:
	$(Q)sh scripts/install-deps.sh build

check-test-deps:
	$(Q)sh scripts/install-deps.sh test

run: check-deps
	$(Q)$(MAKE) --no-print-directory binaries
	$(DAEMON) $(RUN_ARGS)

test: check-test-deps
	$(Q)$(MAKE) --no-print-directory $(BINS) $(UNIT_BINS) $(E2E_BINS) $(FRAMES_TOOL) $(READ_TOOL) $(BENCH_BIN) \
	    $(QUEUE_BENCH_BIN) $(RELAY_TEST_BINS) \
	    $(if $(SANITIZER),,$(FUZZ_BIN) $(FUZZ_ADOPT_BIN) $(TSAN_BIN) $(QUEUE_TSAN_BIN))
	$(Q)SHMBROKERD=$(BUILD)/shmbrokerd SHMBROKERCTL=$(BUILD)/shmbrokerctl PYTHON=$(PYTHON) \
	    SHMB_SANITIZER=$(SANITIZER) SHMB_SOAK=$(BUILD)/tests/soak FUZZ_BIN=$(FUZZ_BIN) FUZZ_SECONDS=$(FUZZ_SECONDS) \
	    FUZZ_RUNS=$(FUZZ_RUNS) FUZZ_ADOPT_BIN=$(FUZZ_ADOPT_BIN) \
	    FUZZ_ADOPT_SECONDS=$(FUZZ_ADOPT_SECONDS) sh tests/run.sh $(BUILD) $(TEST_RUNS)

# aarch64 under qemu-user (tests/arm64/run.sh): the daemon, the library and
# the queue's C tests cross-compiled into ARM64_BUILD, then run with the
# Python read and queue tests in an arm64 Debian root (cached under
# /var/tmp) through binfmt_misc. Needs root.
ARM64_BUILD ?= build-arm64
test-arm64:
	$(Q)sh scripts/install-deps.sh arm64
	$(Q)MAKE="$(MAKE)" sh tests/arm64/run.sh $(ARM64_BUILD)

# Only the soak, at whatever length: make soak SOAK_SECONDS=30 SANITIZER=address
# (tests/run.sh adds the length asked for to its per-program time limit).
soak: check-test-deps
	$(Q)$(MAKE) --no-print-directory $(BINS) $(BUILD)/tests/soak
	$(Q)SHMBROKERD=$(BUILD)/shmbrokerd SHMBROKERCTL=$(BUILD)/shmbrokerctl \
	    SHMB_SOAK=$(BUILD)/tests/soak sh tests/run.sh $(BUILD) $(BUILD)/tests/soak \
	    tests/e2e/soak_valgrind.sh

# The benchmark: shmbroker against Redis, memcpy and a bare socket round
# trip, then the queues, in one run (installs redis-server and ZeroMQ when
# missing). BENCH_QUICK=1 for a smoke run.
BENCH_BIN := $(BUILD)/shmb-bench
# The benchmark's own loops that write and read every byte are aligned, so
# that its figures do not move when an unrelated change shifts its code: a
# 16-byte shift of the read loop cost 14 % at 4 MiB on this machine.
$(BUILD)/obj/tests/bench/bench.o: ALLCFLAGS += -falign-loops=64
$(BENCH_BIN): $(call OBJ,tests/bench/bench.c) $(LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(PKGS_LIBS) -lm
# The queues' benchmark: a queue against a busy-polling ring, ZeroMQ PUB/SUB
# and a Unix-socket fan-out. 'make bench' and 'make test' build it (the tests
# try its failures): ZeroMQ is a bench and test package, not one the build
# needs.
QUEUE_BENCH_BIN := $(BUILD)/shmb-queue-bench
ZMQ_CFLAGS = $(shell pkg-config --cflags libzmq 2>/dev/null)
ZMQ_LIBS   = $(shell pkg-config --libs libzmq 2>/dev/null)
$(BUILD)/obj/tests/bench/queue_bench.o: ALLCFLAGS += $(ZMQ_CFLAGS)
$(QUEUE_BENCH_BIN): $(call OBJ,tests/bench/queue_bench.c) $(LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(PKGS_LIBS) $(ZMQ_LIBS) -lm

bench: check-deps
	$(Q)sh scripts/install-deps.sh bench
	$(Q)$(MAKE) --no-print-directory $(BINS) $(BENCH_BIN) $(QUEUE_BENCH_BIN)
	$(Q)PYTHON=$(PYTHON) sh scripts/bench.sh $(BUILD)

# vLLM's own store and queue side by side with the drop-ins
# (tests/bench/bench_vllm.py), when vLLM is importable in $(PYTHON) or
# VLLM_SRC names a vLLM source tree: VLLM_SRC=/path/to/vllm make bench-vllm.
# BENCH_QUICK=1 for a smoke run. Writes $(BUILD)/bench/vllm.txt, vllm.json
# and the chart vllm.svg.
bench-vllm: check-deps
	$(Q)sh scripts/install-deps.sh bench-vllm
	$(Q)$(MAKE) --no-print-directory $(BINS)
	$(Q)mkdir -p $(BUILD)/bench && : >$(BUILD)/bench/vllm.json
	$(Q)SHMBROKERD=$(DAEMON) PYTHONPATH=client/python $(PYTHON) tests/bench/bench_vllm.py \
	    --json $(BUILD)/bench/vllm.json >$(BUILD)/bench/vllm.txt; st=$$?; \
	    cat $(BUILD)/bench/vllm.txt; exit $$st
	$(Q)$(PYTHON) scripts/bench_charts.py $(BUILD)/bench --vllm $(BUILD)/bench/vllm.json

# The daemon's instructions per request over a fixed workload (valgrind's
# callgrind): a measure that the machine's load does not move, for comparing
# two builds of a change that should not cost anything.
bench-instructions: check-test-deps
	$(Q)$(MAKE) --no-print-directory $(DAEMON)
	$(Q)sh scripts/bench_instructions.sh $(BUILD)

$(BUILD)/obj/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALLCFLAGS) -c -o $@ $<

$(DAEMON): $(call OBJ,$(DAEMON_SRC)) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(PKGS_LIBS)

# The library carries the proto objects it needs, so users link only it.
# They are linked into one object whose only global symbols are shmb_*, so
# that the static library, like the shared one's version script, lends no
# other name (line_*, ...) to the programs that link it.
$(LIB_A): $(call OBJ,$(LIB_SRC)) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)rm -f $@ $(BUILD)/obj/libshmbroker.o
	$(Q)$(LD) -r -o $(BUILD)/obj/libshmbroker.o $^
	$(Q)$(OBJCOPY) --wildcard --keep-global-symbol='shmb_*' $(BUILD)/obj/libshmbroker.o
	$(Q)$(AR) rcs $@ $(BUILD)/obj/libshmbroker.o

$(LIB_SO): $(call OBJ,$(LIB_SRC)) $(PROTO_OBJ)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -shared -Wl,-soname,$(LIB_SONAME) \
	    -Wl,--version-script=client/libshmbroker.map -o $@ $^ $(PKGS_LIBS)
	$(Q)ln -sf $(LIB_SONAME) $(BUILD)/libshmbroker.so

# ---- shmbroker-relay (relay/): objects between hosts' brokers over UCX ----
# A program of its own: the daemon keeps no network code. It links the
# library like any worker, UCX (libucx-dev) and libcrypto (its key's HMAC).
RELAY_SRC   := relay/main.c relay/log.c relay/admit.c relay/tcp_guard.c relay/peer.c relay/ucx_guard.c relay/wireup_addr.c relay/wire.c relay/auth.c relay/fetch.c relay/forward.c relay/stream.c relay/stream_send.c relay/local.c
RELAY       := $(BUILD)/shmbroker-relay
RELAY_CFLAGS = $(shell pkg-config --cflags ucx libcrypto 2>/dev/null)
RELAY_LIBS   = $(shell pkg-config --libs ucx libcrypto 2>/dev/null)
BINS        += $(RELAY)
$(call OBJ,$(RELAY_SRC) tests/relay/hostile_peer.c tests/relay/hostile_tcp.c): ALLCFLAGS += $(RELAY_CFLAGS)
$(RELAY): $(call OBJ,$(RELAY_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(PKGS_LIBS) $(RELAY_LIBS)
# The relay test (tests/relay/test_relay.py): two network namespaces, a daemon and a
# relay in each, UCX over TCP; and a peer that speaks garbage.
RELAY_HOSTILE := $(BUILD)/tests/relay-hostile-peer
$(RELAY_HOSTILE): $(call OBJ,tests/relay/hostile_peer.c tests/relay/hostile_tcp.c relay/wire.c relay/auth.c) $(LIB_A)
$(RELAY_HOSTILE): TEST_LDFLAGS = $(PKGS_LIBS) $(RELAY_LIBS)
TEST_RUNS   += tests/relay/test_relay.py
# Queues with readers on other hosts, in the same two namespaces.
TEST_RUNS   += tests/relay/test_queue_relay.py
# The relays under attack on a queue's path (a daemon killed under a stream...).
TEST_RUNS   += tests/relay/test_relay_attacks.py
# The relay's unit as make install stages it, its ExecStart run beside a daemon.
ifeq ($(SANITIZER),)
TEST_RUNS   += tests/relay/test_unit.sh
endif
RELAY_TEST_BINS := $(RELAY) $(RELAY_HOSTILE)
# The relay's parser of UCX's TCP transport (relay/tcp_guard.c), with the
# recv() it defines over real sockets.
UNIT_BINS += $(BUILD)/tests/test_tcp_guard
TEST_RUNS += $(BUILD)/tests/test_tcp_guard
$(call OBJ,tests/unit/test_tcp_guard.c relay/tcp_guard.c relay/admit.c relay/log.c): ALLCFLAGS += $(RELAY_CFLAGS)
$(BUILD)/tests/test_tcp_guard: $(call OBJ,tests/unit/test_tcp_guard.c relay/tcp_guard.c relay/admit.c \
                               relay/log.c) $(BASE_OBJ)
# The relay's parser of UCX's packed worker address (relay/wireup_addr.c).
UNIT_BINS += $(BUILD)/tests/test_wireup_addr
TEST_RUNS += $(BUILD)/tests/test_wireup_addr
$(BUILD)/tests/test_wireup_addr: $(call OBJ,tests/unit/test_wireup_addr.c relay/wireup_addr.c)
# The relay's bench table: fetch bandwidth against ucx_perftest and Redis GET,
# and a remote queue's latency and rate against ZeroMQ PUB/SUB, between two
# namespaces (root). BENCH_QUICK=1 for one round.
.PHONY: bench-relay
bench-relay: check-deps
	$(Q)sh scripts/install-deps.sh bench
	$(Q)$(MAKE) --no-print-directory $(BINS)
	$(Q)SHMB_BUILD_DIR=$(BUILD) SHMBROKERD=$(DAEMON) $(PYTHON) tests/relay/bench.py
	$(Q)SHMB_BUILD_DIR=$(BUILD) SHMBROKERD=$(DAEMON) $(PYTHON) tests/relay/bench_queue.py

# The pkg-config file and the service unit name installed paths, so they are
# written at install time, with this install's PREFIX and directories.
SUBST = sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@LIBDIR@|$(LIBDIR)|g' \
            -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|g' -e 's|@VERSION@|$(VERSION)|g' \
            -e 's|@SBINDIR@|$(SBINDIR)|g' -e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g'

# The examples README.md and docs/queues.md show, built so that they cannot
# rot: tests/python/test_docs.py runs them with the pages' other examples, in
# reading order (and tests/e2e/test_queues the queue's).
$(BUILD)/obj/client/example.o $(BUILD)/obj/client/example_queue.o: ALLCFLAGS += -Iclient
$(EXAMPLE): $(call OBJ,client/example.c) $(LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(PKGS_LIBS)
$(QUEUE_EXAMPLE): $(call OBJ,client/example_queue.c) $(LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(PKGS_LIBS)

$(CTL): $(call OBJ,$(CTL_SRC)) $(LIB_A)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(PKGS_LIBS)

$(BUILD)/tests/%:
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALLLDFLAGS) -o $@ $^ $(TEST_LDFLAGS) $(CMOCKA_LIBS)

fuzz: check-test-deps
	$(Q)$(MAKE) --no-print-directory $(FUZZ_BIN)
	@mkdir -p $(FUZZ_BUILD)/corpus
	$(FUZZ_BIN) -max_total_time=$(FUZZ_SECONDS) -runs=$(FUZZ_RUNS) -max_len=8192 \
	    -dict=tests/fuzz/request.dict -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/ \
	    $(FUZZ_BUILD)/corpus \
	    tests/fuzz/corpus

$(FUZZ_BIN): $(FUZZ_SRC) $(wildcard proto/*.h daemon/*.h tests/support/*.h) Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CLANG   $@")
	$(Q)clang -std=c11 -D_GNU_SOURCE -DSHMB_VERSION='"$(VERSION)"' -g -O1 $(WARN) \
	    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    -Iproto -Idaemon -Itests/support $(PKGS_CFLAGS) -o $@ $(FUZZ_SRC) $(PKGS_LIBS)

$(TSAN_BIN): $(TSAN_SRC) $(wildcard proto/*.h client/*.h tests/e2e/*.h) Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TSAN    $@")
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -DSHMB_VERSION='"$(VERSION)"' -g -O1 $(WARN) \
	    -fsanitize=thread -fno-omit-frame-pointer -Iproto -Iclient -Itests/support \
	    $(PKGS_CFLAGS) -o $@ $(TSAN_SRC) $(PKGS_LIBS) $(CMOCKA_LIBS)

$(QUEUE_TSAN_BIN): $(QUEUE_TSAN_SRC) $(wildcard proto/*.h) Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  TSAN    $@")
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) -fsanitize=thread -fno-omit-frame-pointer \
	    -Iproto -o $@ $(QUEUE_TSAN_SRC) -lpthread $(CMOCKA_LIBS)

fuzz-adopt: check-test-deps
	$(Q)$(MAKE) --no-print-directory $(FUZZ_ADOPT_BIN)
	$(Q)FUZZ_ADOPT_BIN=$(FUZZ_ADOPT_BIN) FUZZ_ADOPT_SECONDS=$(FUZZ_ADOPT_SECONDS) \
	    FUZZ_ADOPT_CORPUS=$(FUZZ_BUILD)/corpus-adopt sh tests/fuzz/run_fuzz_adopt.sh

$(FUZZ_ADOPT_BIN): $(FUZZ_ADOPT_SRC) $(wildcard proto/*.h daemon/*.h) Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CLANG   $@")
	$(Q)clang -std=c11 -D_GNU_SOURCE -g -O1 $(WARN) \
	    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
	    -Iproto -Idaemon -o $@ $(FUZZ_ADOPT_SRC)

# ---- packaging: the wheel, the uninstalled pkg-config file, the API reference
# What 'all' and 'run' ask a sub-make for: one phony goal with a recipe, so
# that the sub-make prints nothing when everything is built (named files
# would each get a "make[1]: '...' is up to date." line before the daemon's).
# Arguments for the daemon 'make run' starts: make run RUN_ARGS='--size 1G'.
RUN_ARGS ?=

# pkg-config for programs built against this tree, before any install:
# PKG_CONFIG_PATH=build cc x.c $(pkg-config --cflags --libs shmbroker). The
# rpath lets such a program find build/libshmbroker.so.1 when it runs.
UNINSTALLED_PC := $(BUILD)/shmbroker.pc
BINS += $(UNINSTALLED_PC)
$(UNINSTALLED_PC): client/shmbroker.pc.in Makefile
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  GEN     $@")
	$(Q)sed -e 's|@PREFIX@|$(CURDIR)|g' -e 's|@LIBDIR@|$(abspath $(BUILD))|g' \
	    -e 's|@INCLUDEDIR@|$(CURDIR)/client|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|^Libs: -L$${libdir}|Libs: -L$${libdir} -Wl,-rpath,$${libdir}|' $< > $@
.PHONY: binaries wheel wheel-file man3 print-version deb-check-version
# debian/changelog's newest entry names the version too (dpkg takes the
# packages' from it): 'make deb' refuses to build when it is not VERSION.
deb-check-version:
	$(Q)v=$$(sed -n '1s/^[^(]*(\([^)]*\)).*/\1/p' debian/changelog); u=$${v#*:}; u=$${u%-*}; \
	if [ "$$u" != "$(VERSION)" ]; then \
	    echo "make deb: debian/changelog's newest entry is $$v, the Makefile's VERSION $(VERSION):" \
	        "add an entry for $(VERSION) (dch -v $(VERSION)) or set VERSION to $$u" >&2; exit 1; fi
# The one version: the wheel, the library's and the .deb's (debian/changelog
# and pyproject.toml must agree: tests/packaging/test_versions.sh).
print-version:
	@echo $(VERSION)
binaries: $(BINS)
	@:

# The Python package as a wheel, for venvs: python3 -m venv v &&
# v/bin/pip install build/dist/shmbroker-$(VERSION)-py3-none-any.whl. Written
# with the standard library's zipfile (scripts/make_wheel.py): no setuptools,
# no network. Its version is VERSION above; pyproject.toml must agree.
WHEEL := $(BUILD)/dist/shmbroker-$(VERSION)-py3-none-any.whl
# What the wheel and README's 'python3 -m venv' need first (python3-venv), as
# 'make' installs what the build needs; then the wheel, quietly when it is
# up to date.
wheel:
	$(Q)sh scripts/install-deps.sh wheel
	$(Q)$(MAKE) --no-print-directory wheel-file
wheel-file: $(WHEEL)
	@:
$(WHEEL): $(wildcard client/python/shmbroker/*.py) client/python/pyproject.toml LICENSE \
          scripts/make_wheel.py Makefile
	@$(if $(Q),echo "  WHEEL   $@")
	$(Q)$(PYTHON) scripts/make_wheel.py $(VERSION) $(dir $@) client/python >/dev/null

# libshmbroker(3) is written from shmbroker.h's comments and checked in (the
# build needs no Python); tests/packaging/test_man3.sh holds it in step.
man3:
	$(PYTHON) scripts/gen_man3.py $(VERSION) client/shmbroker.h > client/libshmbroker.3.tmp
	mv client/libshmbroker.3.tmp client/libshmbroker.3

# Where make install puts README.md, docs/*.md and the Python package's
# reference (pydoc's text, written at install time by the python3 that gets
# the package).
DOCDIR   ?= $(PREFIX)/share/doc/shmbroker
PYDOCDIR ?= $(DOCDIR)
# Run after installing the shared library into the live system (no DESTDIR),
# so that the loader finds libshmbroker.so.1 at once.
LDCONFIG ?= ldconfig

# The packaging tests (tests/packaging): the wheel in a fresh venv offline,
# the install's ldconfig, the uninstalled and static pkg-config links, the
# man page in step, the versions, make run's output, apt's lock, what the
# .deb ships, the deploy manifests.
PKG_TESTS := tests/packaging/test_versions.sh tests/packaging/test_make_run.sh \
             tests/packaging/test_pkgconfig.sh tests/packaging/test_wheel.sh \
             tests/packaging/test_man3.sh tests/packaging/test_deps_lock.sh \
             tests/packaging/test_deb_files.py tests/packaging/test_deploy.py
# They build and install the plain build (a sanitizer's library cannot be
# linked -static), so sanitizer builds leave them out.
ifeq ($(SANITIZER),)
TEST_RUNS += $(PKG_TESTS)
endif

install: all
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(SBINDIR) $(DESTDIR)$(LIBDIR)/pkgconfig \
	    $(DESTDIR)$(INCLUDEDIR)
	install -m 0755 $(DAEMON) $(DESTDIR)$(SBINDIR)/shmbrokerd
	install -m 0755 $(CTL) $(DESTDIR)$(BINDIR)/shmbrokerctl
	install -m 0755 $(RELAY) $(DESTDIR)$(SBINDIR)/shmbroker-relay
	install -m 0644 $(LIB_A) $(DESTDIR)$(LIBDIR)/libshmbroker.a
	install -m 0755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/$(LIB_SONAME)
	ln -sf $(LIB_SONAME) $(DESTDIR)$(LIBDIR)/libshmbroker.so
	install -m 0644 client/shmbroker.h $(DESTDIR)$(INCLUDEDIR)/shmbroker.h
	$(SUBST) client/shmbroker.pc.in > $(DESTDIR)$(LIBDIR)/pkgconfig/shmbroker.pc
	install -d $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(MANDIR)/man8 \
	    $(DESTDIR)$(MANDIR)/man1
	$(SUBST) systemd/shmbrokerd.service.in > $(DESTDIR)$(UNITDIR)/shmbrokerd.service
	$(SUBST) systemd/shmbrokerd.socket.in > $(DESTDIR)$(UNITDIR)/shmbrokerd.socket
	$(SUBST) systemd/shmbroker-relay.service.in > $(DESTDIR)$(UNITDIR)/shmbroker-relay.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/shmbrokerd.service $(DESTDIR)$(UNITDIR)/shmbrokerd.socket \
	    $(DESTDIR)$(UNITDIR)/shmbroker-relay.service \
	    $(DESTDIR)$(LIBDIR)/pkgconfig/shmbroker.pc
	@# The settings files are the operator's: installed when absent, never replaced.
	install -d $(DESTDIR)$(SYSCONFDIR)/default
	[ -e $(DESTDIR)$(SYSCONFDIR)/shmbrokerd.conf ] || \
	    install -m 0644 systemd/shmbrokerd.conf $(DESTDIR)$(SYSCONFDIR)/shmbrokerd.conf
	[ -e $(DESTDIR)$(SYSCONFDIR)/default/shmbrokerd ] || \
	    install -m 0644 systemd/shmbrokerd.default $(DESTDIR)$(SYSCONFDIR)/default/shmbrokerd
	[ -e $(DESTDIR)$(SYSCONFDIR)/default/shmbroker-relay ] || \
	    install -m 0644 systemd/shmbroker-relay.default $(DESTDIR)$(SYSCONFDIR)/default/shmbroker-relay
	install -m 0644 systemd/shmbroker.sysusers $(DESTDIR)$(SYSUSERSDIR)/shmbroker.conf
	install -m 0644 daemon/shmbrokerd.8 $(DESTDIR)$(MANDIR)/man8/shmbrokerd.8
	install -m 0644 relay/shmbroker-relay.8 $(DESTDIR)$(MANDIR)/man8/shmbroker-relay.8
	install -m 0644 client/shmbrokerctl.1 $(DESTDIR)$(MANDIR)/man1/shmbrokerctl.1
	install -d $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(DOCDIR)
	install -m 0644 client/libshmbroker.3 $(DESTDIR)$(MANDIR)/man3/libshmbroker.3
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	$(Q)if [ -n "$(wildcard docs/*.md)" ]; then \
	    install -d $(DESTDIR)$(DOCDIR)/docs && \
	    install -m 0644 $(wildcard docs/*.md) $(DESTDIR)$(DOCDIR)/docs/; fi
	@# The dist-info beside the package is what importlib.metadata finds: its
	@# entry_points.txt declares the vLLM plugin (client/python/pyproject.toml's).
	$(Q)if [ -n "$(PY_VERSION)" ]; then \
	    install -d $(DESTDIR)$(PYTHONDIR)/shmbroker $(DESTDIR)$(PYTHONDIR)/$(PY_DISTINFO) && \
	    install -m 0644 client/python/shmbroker/*.py $(DESTDIR)$(PYTHONDIR)/shmbroker/ && \
	    printf 'Metadata-Version: 2.1\nName: shmbroker\nVersion: %s\nSummary: %s\n' \
	        '$(VERSION)' 'Zero-copy Python client of shmbrokerd, the shared-memory object broker' \
	        > $(DESTDIR)$(PYTHONDIR)/$(PY_DISTINFO)/METADATA && \
	    printf '[vllm.general_plugins]\nshmbroker = shmbroker.vllm_plugin:register\n' \
	        > $(DESTDIR)$(PYTHONDIR)/$(PY_DISTINFO)/entry_points.txt && \
	    printf 'make\n' > $(DESTDIR)$(PYTHONDIR)/$(PY_DISTINFO)/INSTALLER && \
	    chmod 0644 $(DESTDIR)$(PYTHONDIR)/$(PY_DISTINFO)/* && \
	    install -d $(DESTDIR)$(PYDOCDIR) && \
	    $(PYTHON) scripts/python_reference.py client/python \
	        > $(DESTDIR)$(PYDOCDIR)/python-reference.txt && \
	    chmod 0644 $(DESTDIR)$(PYDOCDIR)/python-reference.txt; \
	else echo "$(PYTHON) not found: the Python package (client/python) is not installed"; fi
	@# Into the live system, the loader's cache learns the new library at once
	@# (a staged DESTDIR install leaves that to its package's triggers).
	$(Q)if [ -z "$(DESTDIR)" ]; then \
	    if [ "$$(id -u)" -eq 0 ]; then echo "$(LDCONFIG)" && $(LDCONFIG) || exit 1; \
	    else echo "not root: $(LDCONFIG) not run; the loader's cache may not know $(LIBDIR)/$(LIB_SONAME) until root runs it"; fi; \
	    $(LDCONFIG) -p 2>/dev/null | grep -q ' => $(LIBDIR)/$(LIB_SONAME)$$' || \
	        echo "note: the loader does not search $(LIBDIR): add it to a file in /etc/ld.so.conf.d/ and run ldconfig, or run programs with LD_LIBRARY_PATH=$(LIBDIR)"; \
	fi

uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/shmbrokerd $(DESTDIR)$(SBINDIR)/shmbroker-relay $(DESTDIR)$(BINDIR)/shmbrokerctl \
	    $(DESTDIR)$(LIBDIR)/libshmbroker.a $(DESTDIR)$(LIBDIR)/$(LIB_SONAME) \
	    $(DESTDIR)$(LIBDIR)/libshmbroker.so $(DESTDIR)$(INCLUDEDIR)/shmbroker.h \
	    $(DESTDIR)$(LIBDIR)/pkgconfig/shmbroker.pc \
	    $(DESTDIR)$(UNITDIR)/shmbrokerd.service $(DESTDIR)$(UNITDIR)/shmbrokerd.socket \
	    $(DESTDIR)$(UNITDIR)/shmbroker-relay.service \
	    $(DESTDIR)$(SYSUSERSDIR)/shmbroker.conf $(DESTDIR)$(MANDIR)/man8/shmbrokerd.8 \
	    $(DESTDIR)$(MANDIR)/man8/shmbroker-relay.8 \
	    $(DESTDIR)$(MANDIR)/man1/shmbrokerctl.1 $(DESTDIR)$(MANDIR)/man3/libshmbroker.3 \
	    $(DESTDIR)$(PYDOCDIR)/python-reference.txt
	rm -rf $(DESTDIR)$(DOCDIR)/README.md $(DESTDIR)$(DOCDIR)/docs
	rmdir $(DESTDIR)$(DOCDIR) 2>/dev/null || true
	$(Q)if [ -n "$(PY_VERSION)" ]; then rm -rf $(DESTDIR)$(PYTHONDIR)/shmbroker \
	    $(DESTDIR)$(PYTHONDIR)/$(PY_DISTINFO); \
	else echo "$(PYTHON) not found: the Python package (client/python) is left alone"; fi
	@echo "kept the settings $(DESTDIR)$(SYSCONFDIR)/shmbrokerd.conf, $(DESTDIR)$(SYSCONFDIR)/default/shmbrokerd and $(DESTDIR)$(SYSCONFDIR)/default/shmbroker-relay (remove them by hand)"

# The Debian packages (debian/), built by Debian's own tools in a copy of the
# files git tracks: dpkg-buildpackage writes its results beside the source
# directory, so the copy is $(DEB_STAGE)/shmbroker and nothing is written
# outside build/ but the four packages copied to DEB_OUT (the -dbgsym ones stay
# in $(DEB_STAGE)). The build's log is
# $(DEB_STAGE)/build.log; lintian then checks the packages and fails the target
# on an error. The outer make's flags and variables stay out of the build.
DEB_OUT   ?= build/deb
DEB_STAGE := build/debpkg

deb: deb-check-version
	$(Q)sh scripts/install-deps.sh deb
	$(Q)rm -rf $(DEB_STAGE) && mkdir -p $(DEB_STAGE)/shmbroker $(DEB_OUT)
	$(Q)git ls-files -z | xargs -0 sh -c 'for f; do [ ! -e "$$f" ] || \
	    cp -P --parents "$$f" $(DEB_STAGE)/shmbroker/; done' sh
	@echo "  DEB     $(DEB_STAGE) (log: $(DEB_STAGE)/build.log)"
	$(Q)cd $(DEB_STAGE)/shmbroker && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
	    dpkg-buildpackage -us -uc -b >../build.log 2>&1 || \
	    { tail -n 40 ../build.log; echo "make deb: dpkg-buildpackage failed, see $(DEB_STAGE)/build.log" >&2; exit 1; }
	$(Q)rm -f $(DEB_OUT)/shmbroker_*.deb $(DEB_OUT)/libshmbroker1_*.deb \
	    $(DEB_OUT)/libshmbroker-dev_*.deb $(DEB_OUT)/python3-shmbroker_*.deb
	$(Q)cp $(DEB_STAGE)/shmbroker_*.deb $(DEB_STAGE)/libshmbroker1_*.deb \
	    $(DEB_STAGE)/libshmbroker-dev_*.deb $(DEB_STAGE)/python3-shmbroker_*.deb $(DEB_OUT)/
	@echo "  LINTIAN $(DEB_STAGE)/*.changes"
	$(Q)lintian --fail-on error $(DEB_STAGE)/*.changes
	@ls -1 $(DEB_OUT)/*.deb

clean:
	rm -rf build build-address build-undefined build-thread build-fuzz build-arm64

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
