# kvcached: the one entry point. Out-of-tree builds in build/ (optimized) and
# build-asan/ (AddressSanitizer + UndefinedBehaviorSanitizer).
#
#   make            build everything (optimized)
#   make run        install missing packages, build, start kvcached in the foreground
#   make test       both builds, then every test; ends with "N passed, N failed"
#   make test T=name    one test (a unit or integration test name) in both builds
#   make test-repeat T=name N=20   that test N times in both builds (flakiness)
#   make check      the suite under sanitizers only, with the long model run
#   make bench      benchmarks (never part of pass/fail); ends with "goal rows: N met,
#                   N not met, N unreliable"
#   make bench BENCH_ROWS=direct,spin   only those groups of rows (a comma list of
#                   words, each matched inside the group names: ping copy direct
#                   lease held servers spin stall multi decode prefix eviction scale
#                   events cluster; python: the Python package against the C client)
#   make soak       the verified soak (SOAK_CLIENTS=16, SOAK_SECONDS=60)
#   make valgrind   the integration suite's daemon under valgrind memcheck
#   make fuzz       libFuzzer (clang) on each target for FUZZ_SECONDS (default 60)
#   make fuzz-corpus    regenerate the checked-in seed corpus (tests/fuzz/corpus)
#   make tsan       the integration suite under ThreadSanitizer (build-tsan/)
#   make deps       install the Debian packages the build and the tests need, if missing
#   make test-deps  make deps, and promtool (the tests', from Debian's prometheus package)
#   make install    binaries, library, headers, kvcache.pc, units, config, man pages
#                   (PREFIX=/usr/local, DESTDIR=, SYSCONFDIR=/etc; see "install" below)
#   make uninstall  removes what install installed, except the config file
#   make systemd/kvcached.conf   regenerates the example config from the option table
#
# Knobs: SANITIZE=1 (or thread), OPT=-O2, MALLOC=jemalloc|libc, V=1, CI=true (-Werror).

ifeq ($(FUZZ),1)
  # libFuzzer build: every object instrumented, fuzz targets linked with its main.
  B ?= build-fuzz
  CC := clang
  MALLOC ?= libc
  OPT ?= -O1 -g -fno-omit-frame-pointer
  SANFLAGS := -fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all
else ifeq ($(SANITIZE),thread)
  # ThreadSanitizer: the daemon's thread-pool copies (offload_bytes).
  B ?= build-tsan
  MALLOC ?= libc
  OPT ?= -O1 -g -fno-omit-frame-pointer
  SANFLAGS := -fsanitize=thread
else ifeq ($(SANITIZE),1)
  B ?= build-asan
  MALLOC ?= libc
  OPT ?= -O1 -g -fno-omit-frame-pointer
  SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all
else
  B ?= build
  MALLOC ?= jemalloc
  OPT ?= -O2 -g
  SANFLAGS :=
endif

CC ?= cc
WARN := -Wall -Wextra -Wshadow -Wconversion -Wno-sign-conversion \
        -Wmissing-prototypes -Wstrict-prototypes -Wpointer-arith -Wvla \
        -Wno-missing-field-initializers
ifeq ($(CI),true)
  WARN += -Werror
endif
CPPFLAGS := -Iinclude -Isrc -Iproto -I$(B)/gen -D_GNU_SOURCE -MMD -MP
CFLAGS := -std=c11 $(OPT) $(WARN) $(SANFLAGS) -fPIC -pthread
LDFLAGS := $(SANFLAGS) -pthread
ifeq ($(MALLOC),jemalloc)
  MALLOC_LIBS := -ljemalloc
else
  MALLOC_LIBS :=
endif
UV_LIBS := -luv
# The cluster tier (doc/cluster.md): hiredis's async API on the daemon's loop.
REDIS_LIBS := -lhiredis
ENGINE_LIBS := -lcrypto -lxxhash
PB_LIBS := -lprotobuf-c
# The daemon's event stream (daemon/events/events*.c): ZeroMQ; msgpack-c's packer
# is all inline functions of its headers.
EVENTS_LIBS := -lzmq

ifeq ($(V),1)
  Q :=
  say = @true
else
  Q := @
  say = @printf '  %-6s %s\n' $(1) $(2)
endif

# ---- sources -------------------------------------------------------------
ENGINE_SRC := $(wildcard src/*.c)
ENGINE_OBJ := $(ENGINE_SRC:%.c=$(B)/%.o)
PROTO_C := $(B)/gen/kvcache.pb-c.c
PROTO_OBJ := $(B)/gen/kvcache.pb-c.o
# The codec (proto/*.c): the wire conversions and the frame format, linked by
# the daemon and the client library alike.
CODEC_SRC := $(wildcard proto/*.c)
CODEC_OBJ := $(CODEC_SRC:%.c=$(B)/%.o)
# The transfer geometry (src/layout.c), the engine's and the client's.
GEOM_OBJ := $(B)/src/layout.o
# daemon/ is split in folders by concern (doc/design.md, the map); its
# files include one another's headers by name, every folder on the path.
DAEMON_SRC := $(wildcard daemon/*.c daemon/*/*.c daemon/*/*/*.c)
DAEMON_OBJ := $(DAEMON_SRC:%.c=$(B)/%.o)
DAEMON_DIRS := daemon $(patsubst %/,%,$(sort $(dir $(wildcard daemon/*/*.h daemon/*/*/*.h \
  daemon/*/*.c daemon/*/*/*.c))))
DAEMON_INC := $(DAEMON_DIRS:%=-I%)
CLIENT_SRC := $(filter-out client/kvcachectl.c,$(wildcard client/*.c))
CLIENT_OBJ := $(CLIENT_SRC:%.c=$(B)/%.o)
CTL_OBJ := $(B)/client/kvcachectl.o
UNIT_SRC := $(wildcard tests/unit/*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(B)/tests/unit_%)
IT_SRC := $(wildcard tests/integration/*.c)
EXAMPLE_SRC := $(wildcard client/examples/*.c)
EXAMPLE_BIN := $(patsubst client/examples/%.c,$(B)/examples/%,$(EXAMPLE_SRC))
.SECONDARY: $(EXAMPLE_SRC:%.c=$(B)/%.o)
IT_BIN := $(IT_SRC:tests/integration/%.c=$(B)/tests/it_%)
BENCH_SRC := $(wildcard tests/bench/*.c)
BENCH_BIN := $(BENCH_SRC:tests/bench/%.c=$(B)/bench/%)
TEST_MAIN_OBJ := $(B)/tests/test_main.o
# Fuzz targets: each is a replay test in every build (tests/fuzz/replay.c,
# any compiler) and a libFuzzer binary in the FUZZ=1 build.
FUZZ_TARGETS := frame msg fast handler
FUZZ_DAEMON_OBJ := $(filter-out $(B)/daemon/main.o $(B)/daemon/net/conn.o $(B)/daemon/net/listen.o \
  $(B)/daemon/drain.o $(B)/daemon/signals.o,$(DAEMON_OBJ))
FUZZ_COMMON_OBJ := $(B)/tests/fuzz/fake_conn.o $(FUZZ_DAEMON_OBJ) $(CODEC_OBJ) $(PROTO_OBJ) \
  $(B)/libkvcengine.a
FUZZ_REPLAY_BIN := $(FUZZ_TARGETS:%=$(B)/tests/fuzz_%)
FUZZ_BIN := $(FUZZ_TARGETS:%=$(B)/fuzz/%)
FUZZ_SECONDS ?= 60

HAVE_PROTO := $(wildcard proto/kvcache.proto)
HAVE_DAEMON := $(DAEMON_SRC)
HAVE_CLIENT := $(CLIENT_SRC)

ALL := $(B)/libkvcengine.a
ifneq ($(HAVE_PROTO),)
ifneq ($(HAVE_DAEMON),)
  ALL += $(B)/kvcached
endif
ifneq ($(HAVE_CLIENT),)
  ALL += $(B)/libkvcache.so $(B)/libkvcache.a $(B)/kvcachectl $(EXAMPLE_BIN)
endif
ifneq ($(HAVE_DAEMON),)
  ALL += $(FUZZ_REPLAY_BIN)
endif
endif
ALL += $(UNIT_BIN) $(IT_BIN)

# The Python package (client/python): its C extension is built against
# libkvcache.a into $(B)/python/kvcache/ with the package's .py files, for the
# tests (PYTHONPATH=$(B)/python). Only in the optimized build: a sanitized
# extension would need the sanitizer runtime preloaded into python.
PY := /usr/bin/python3
PY_INC := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PY_EXT := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
PYEXT_SRC := $(wildcard client/python/src/*.c)
PYEXT_OBJ := $(PYEXT_SRC:%.c=$(B)/%.o)
PYPKG_SRC := $(wildcard client/python/kvcache/*.py client/python/kvcache/*.pyi client/python/kvcache/py.typed)
PYPKG := $(PYPKG_SRC:client/python/%=$(B)/python/%) $(B)/python/kvcache/_kvcache$(PY_EXT)
ifneq ($(HAVE_CLIENT),)
ifeq ($(SANFLAGS),)
ifneq ($(wildcard $(PY_INC)/Python.h),)
  ALL += $(PYPKG)
endif
endif
endif

.PHONY: all run test test-repeat check bench deps test-deps clean install uninstall fuzz fuzz-build fuzz-corpus soak valgrind tsan
all: $(ALL)

# ---- engine --------------------------------------------------------------
$(B)/libkvcengine.a: $(ENGINE_OBJ)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(B)/%.o: %.c
	$(call say,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# ---- wire protocol (generated code lives in build/, never committed) ------
$(B)/gen/kvcache.pb-c.c $(B)/gen/kvcache.pb-c.h: proto/kvcache.proto
	$(call say,PROTOC,$<)
	@mkdir -p $(B)/gen
	$(Q)protoc-c --proto_path=proto --c_out=$(B)/gen $<

$(PROTO_OBJ): $(PROTO_C)
	$(call say,CC,$<)
	$(Q)$(CC) $(CPPFLAGS) $(filter-out -Wconversion -Wshadow -Wmissing-prototypes,$(CFLAGS)) -c $< -o $@

$(DAEMON_OBJ) $(CLIENT_OBJ) $(CTL_OBJ) $(CODEC_OBJ): | $(B)/gen/kvcache.pb-c.h
$(DAEMON_OBJ): CPPFLAGS += $(DAEMON_INC)

# ---- daemon ---------------------------------------------------------------
$(B)/kvcached: $(DAEMON_OBJ) $(CODEC_OBJ) $(PROTO_OBJ) $(B)/libkvcengine.a
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(UV_LIBS) $(REDIS_LIBS) $(PB_LIBS) $(EVENTS_LIBS) $(ENGINE_LIBS) $(MALLOC_LIBS) -lm

# ---- client library and kvcachectl ----------------------------------------
# The client links the protocol, the codec, the transfer geometry and the
# error table, and exports only kvc_*.
CLIENT_DEPS := $(CLIENT_OBJ) $(CODEC_OBJ) $(PROTO_OBJ) $(GEOM_OBJ) $(B)/src/errors.o
$(CLIENT_OBJ) $(CODEC_OBJ) $(PROTO_OBJ) $(GEOM_OBJ): CFLAGS += -fvisibility=hidden
$(B)/libkvcache.so: $(CLIENT_DEPS)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -shared -Wl,-soname,libkvcache.so.1 -o $@ $^ $(PB_LIBS)
$(B)/libkvcache.a: $(CLIENT_DEPS)
	$(call say,AR,$@)
	$(Q)rm -f $@ && ar rcs $@ $^
$(B)/kvcachectl: $(CTL_OBJ) $(B)/libkvcache.a
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(PB_LIBS) -lm

# The worker examples (doc/worker-guide.md), built by make and run by
# tests/integration/examples.c so that they cannot rot.
$(B)/examples/%: $(B)/client/examples/%.o $(B)/libkvcache.a
	$(call say,LD,$@)
	$(Q)mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(PB_LIBS) -lm

# ---- the Python package -----------------------------------------------------
$(PYEXT_OBJ): CPPFLAGS += -isystem $(PY_INC)
$(PYEXT_OBJ): CFLAGS += -fvisibility=hidden
$(B)/python/kvcache/_kvcache$(PY_EXT): $(PYEXT_OBJ) $(B)/libkvcache.a
	$(call say,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -shared -o $@ $^ $(PB_LIBS)
$(B)/python/kvcache/%: client/python/kvcache/%
	@mkdir -p $(dir $@)
	$(Q)cp $< $@

# ---- tests ----------------------------------------------------------------
$(B)/tests/unit_%: $(B)/tests/unit/%.o $(TEST_MAIN_OBJ) $(B)/libkvcengine.a
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(UNIT_LIBS) $(ENGINE_LIBS) $(MALLOC_LIBS) -lm
# The codec's unit test links the codec and the generated protocol too.
$(B)/tests/unit_codec: $(CODEC_OBJ) $(PROTO_OBJ)
$(B)/tests/unit_codec: UNIT_LIBS := $(PB_LIBS)
$(B)/tests/unit/codec.o: | $(B)/gen/kvcache.pb-c.h
# The hand-packed frames, against protobuf-c itself.
$(B)/tests/unit_iowire: $(B)/proto/iowire.o $(PROTO_OBJ)
$(B)/tests/unit_iowire: UNIT_LIBS := $(PB_LIBS)
$(B)/tests/unit/iowire.o: | $(B)/gen/kvcache.pb-c.h
# The byte ring both sides link (proto/ringbuf.c), with the frame header, and
# the fast slots' structs (proto/ringfast.c).
$(B)/tests/unit_ringbuf: $(B)/proto/ringbuf.o $(B)/proto/frame.o $(B)/proto/ringfast.o
# The cluster tier's pure parts (slots, keys and values) are the daemon's.
$(B)/tests/unit_rvalue: $(B)/daemon/tiers/cluster/rvalue.o $(B)/daemon/tiers/cluster/rslot.o
$(B)/tests/unit/%.o: tests/unit/%.c
	$(call say,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -c $< -o $@
$(B)/tests/integration/%.o: tests/integration/%.c | $(B)/gen/kvcache.pb-c.h
	$(call say,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -c $< -o $@
$(B)/tests/it_%: $(B)/tests/integration/%.o $(TEST_MAIN_OBJ) $(B)/libkvcache.a
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(IT_LIBS) $(PB_LIBS) -lm
# The disk tier's tests read and forge page files with the daemon's format.
$(B)/tests/it_tiers: $(B)/daemon/tiers/disk/diskfmt.o
$(B)/tests/it_tiers: IT_LIBS := -lxxhash
$(B)/tests/unit_diskfmt: $(B)/daemon/tiers/disk/diskfmt.o
# The one work queue, on a libuv loop of the test's own.
$(B)/tests/unit_work: $(B)/daemon/work.o $(B)/daemon/log.o
$(B)/tests/unit_work: UNIT_LIBS := $(UV_LIBS)
# The cluster test drives Redis with a plain hiredis client and forges
# values as an attacker would, with the value codec of the daemon.
$(B)/tests/it_cluster: $(B)/daemon/tiers/cluster/rvalue.o
$(B)/tests/it_cluster: IT_LIBS := $(REDIS_LIBS) -lcrypto
$(B)/tests/test_main.o: tests/test_main.c
	$(call say,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -c $< -o $@

# ---- fuzzers ---------------------------------------------------------------
$(B)/tests/fuzz/%.o: tests/fuzz/%.c | $(B)/gen/kvcache.pb-c.h
	$(call say,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(DAEMON_INC) $(CFLAGS) -c $< -o $@
$(B)/tests/fuzz/replay_%.o: tests/fuzz/replay.c
	$(call say,CC,$<)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -Itests -DFUZZ_NAME=$* $(CFLAGS) -c $< -o $@
$(B)/tests/fuzz_%: $(B)/tests/fuzz/fuzz_%.o $(B)/tests/fuzz/replay_%.o $(TEST_MAIN_OBJ) $(FUZZ_COMMON_OBJ)
	$(call say,LD,$@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(UV_LIBS) $(REDIS_LIBS) $(PB_LIBS) $(EVENTS_LIBS) $(ENGINE_LIBS) $(MALLOC_LIBS) -lm
$(B)/fuzz/%: $(B)/tests/fuzz/fuzz_%.o $(FUZZ_COMMON_OBJ)
	$(call say,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -fsanitize=fuzzer -o $@ $^ $(UV_LIBS) $(REDIS_LIBS) $(PB_LIBS) $(EVENTS_LIBS) $(ENGINE_LIBS) -lm
$(B)/tools/gen_corpus: $(B)/tests/fuzz/gen_corpus.o $(FUZZ_COMMON_OBJ)
	$(call say,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(UV_LIBS) $(REDIS_LIBS) $(PB_LIBS) $(EVENTS_LIBS) $(ENGINE_LIBS) $(MALLOC_LIBS) -lm

# ---- benchmarks -------------------------------------------------------------
# Compiled and linked in one step, whose -MMD file lists too little: the
# bench headers are named here.
$(BENCH_BIN): $(wildcard tests/bench/*.h)
$(B)/bench/%: tests/bench/%.c $(B)/libkvcengine.a $(if $(HAVE_CLIENT),$(B)/libkvcache.a)
	$(call say,LD,$@)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(CPPFLAGS) -Itests $(CFLAGS) -o $@ $(filter-out %.h,$^) $(PB_LIBS) $(REDIS_LIBS) $(EVENTS_LIBS) -lmsgpackc $(ENGINE_LIBS) $(MALLOC_LIBS) -lm

# ---- top-level targets ------------------------------------------------------
# Every package the build and make test use (tests/deps.pl, part of make test,
# checks each command the suite runs against this list and the minimal base):
# systemd: systemd-analyze and systemd-socket-activate for the service tests;
# procps: /bin/kill, the unit's ExecReload (systemd-analyze verify looks for it);
# libssl (SHA-256) and libxxhash for the prefix index; pkg-config for the
# install test's client; tmux: kvcachectl top is tested in a real terminal;
# man-db: the man pages are rendered with man --warnings; curl: a real HTTP
# client scrapes the metrics_listen endpoint; the Python package
# (client/python): python3-dev to build its extension, python3-pip,
# -setuptools and -wheel for pip install ./client/python (offline: the
# package's build backend uses Debian's), python3-venv for the virtual
# environment pip installs it into (Debian's python is externally managed:
# pip refuses to install beside its packages), python3-numpy and python3-torch for
# its tensors and the reference decoder, python3-pytest to run its tests;
# the KV event stream (doc/events.md): libzmq3-dev and libmsgpack-dev for the
# daemon's publisher, python3-zmq, python3-msgpack and python3-cbor2 for the
# subscriber its tests run (written to vLLM's schema; cbor2 recomputes vLLM's
# block hashes); the cluster tier (doc/cluster.md): libhiredis-dev (its async
# API on the loop), and for its tests a real cluster: redis-server and
# redis-tools (redis-cli --cluster create); git: the README's test
# (tests/readme.sh) runs it in a copy of the files git tracks, as a fresh
# clone has them (git is the README's first prerequisite anyway).
DEB_PACKAGES := build-essential pkg-config libuv1-dev libprotobuf-c-dev libssl-dev \
                libxxhash-dev protobuf-c-compiler libjemalloc-dev systemd procps \
                tmux man-db curl libzmq3-dev libmsgpack-dev libhiredis-dev redis-server \
                redis-tools \
                git python3-dev python3-setuptools python3-wheel python3-pip python3-venv python3-numpy \
                python3-torch python3-pytest python3-zmq python3-msgpack python3-cbor2
# promtool (promtool check metrics, check rules), which only the tests run,
# comes from Debian's prometheus package, but installing it would install and
# enable the whole server (96 MB, a service, a user): make test-deps (make
# deps, then this) downloads the package (19 MB) and unpacks promtool alone
# into $(PROMTOOL); make run and make all never do.
PROMTOOL := .tools/promtool
# apt-get's output goes here; make deps prints one line of what it installs.
DEPS_LOG ?= /tmp/kvcached-deps.log
deps:
	@missing=""; for p in $(DEB_PACKAGES) $(EXTRA_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	[ -n "$$missing" ] || exit 0; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; \
	elif command -v sudo >/dev/null 2>&1 && { [ -t 0 ] || sudo -n true 2>/dev/null; }; then SUDO=sudo; \
	else echo "make deps: these Debian packages are missing:$$missing" >&2; \
	  echo "make deps: run it as root (or as a user who can sudo), or have root run:" >&2; \
	  echo "  apt-get install --no-install-recommends$$missing" >&2; exit 1; fi; \
	echo "make deps: installing$$missing (apt-get's output in $(DEPS_LOG))"; \
	if ! { $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive \
	       $$SUDO apt-get install -y --no-install-recommends $$missing; } >$(DEPS_LOG) 2>&1; then \
	  tail -n 15 $(DEPS_LOG) >&2; echo "make deps: apt-get failed (the whole log: $(DEPS_LOG))" >&2; \
	  exit 1; fi

# What the tests need besides the packages: promtool.
test-deps: deps
	@[ -x $(PROMTOOL) ] || { \
	  echo "make test-deps: unpacking promtool from Debian's prometheus package into $(PROMTOOL)"; \
	  tmp=$$(mktemp -d) && \
	  { (cd $$tmp && apt-get download prometheus) >>$(DEPS_LOG) 2>&1 || \
	    { [ "$$(id -u)" = 0 ] && apt-get update >>$(DEPS_LOG) 2>&1 && \
	      (cd $$tmp && apt-get download prometheus) >>$(DEPS_LOG) 2>&1; }; } && \
	  dpkg-deb -x $$tmp/prometheus_*.deb $$tmp/root && mkdir -p $(dir $(PROMTOOL)) && \
	  cp $$tmp/root/usr/bin/promtool $(PROMTOOL); rc=$$?; rm -rf $$tmp; \
	  [ $$rc = 0 ] || { echo "make test-deps: cannot get promtool (see $(DEPS_LOG))" >&2; exit 1; }; }

# Builds only what running needs (the daemon and kvcachectl), then runs.
run: deps
	@$(MAKE) --no-print-directory $(B)/kvcached $(B)/kvcachectl
	$(B)/kvcached $(ARGS)

# A failure to install or build counts as one failed test, so the last line is
# always "N passed, N failed" (and the status non-zero when one failed).
TEST_BUILD = $(MAKE) --no-print-directory test-deps && $(MAKE) --no-print-directory all && \
  $(MAKE) --no-print-directory SANITIZE=1 all
TEST_BUILD_FAILED = { echo "FAIL  make test-deps, make all or make SANITIZE=1 all (see above)"; \
  echo "0 passed, 1 failed"; exit 1; }
test:
	@$(TEST_BUILD) || $(TEST_BUILD_FAILED)
	@tests/run.sh $(if $(T),--only "$(T)") build build-asan

# One test (or several, T="a b") N times in both builds, for flakiness:
# make test-repeat T=name N=20. Ends with "N passed, N failed" over all runs.
N ?= 20
test-repeat:
	@[ -n "$(T)" ] || { echo "usage: make test-repeat T=name [N=20]" >&2; exit 2; }
	@$(TEST_BUILD) || $(TEST_BUILD_FAILED)
	@tests/run.sh --only "$(T)" --repeat $(N) build build-asan

check: test-deps
	@$(MAKE) --no-print-directory SANITIZE=1 all
	@KVC_LONG=1 tests/run.sh $(if $(T),--only $(T)) build-asan

SOAK_CLIENTS ?= 16
SOAK_SECONDS ?= 60
soak: deps
	@$(MAKE) --no-print-directory all
	@KVC_SOAK_CLIENTS=$(SOAK_CLIENTS) KVC_SOAK_SECONDS=$(SOAK_SECONDS) KVC_LONG=1 \
	  tests/run.sh --only hard_soak_verified_mix build

# The daemon of every integration test runs under memcheck (tests/valgrind.sh
# stands in for kvcached); a report of errors or definite leaks fails it.
valgrind: test-deps
	@$(MAKE) --no-print-directory deps EXTRA_PACKAGES=valgrind
	@$(MAKE) --no-print-directory MALLOC=libc B=build-vg all
	@rm -f build-vg/kvcached.real && mv build-vg/kvcached build-vg/kvcached.real && \
	  cp tests/valgrind.sh build-vg/kvcached && \
	  KVC_VALGRIND=1 tests/run.sh build-vg; rc=$$?; \
	  mv build-vg/kvcached.real build-vg/kvcached; exit $$rc

# The integration tests against a daemon built with ThreadSanitizer (the
# thread-pool copies of large gets are the daemon's only threads).
tsan: test-deps
	@$(MAKE) --no-print-directory SANITIZE=thread all
	@TSAN_OPTIONS="$${TSAN_OPTIONS:-halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp}" tests/run.sh --it-only build-tsan

# One program prints the one table (tests/bench/kvc_bench.c); engine_bench
# (the engine alone, no daemon) is built too and runs by hand. Then the
# Python package against the C client (tests/bench/py_bench.py, the group
# "python"), in the same run.
bench: EXTRA_PACKAGES += memcached
bench: deps
	@$(MAKE) --no-print-directory all $(BENCH_BIN)
	@rows='$(BENCH_ROWS)'; kv=1; py=1; \
	if [ -n "$$rows" ]; then \
	  case ",$$rows," in *python*) ;; *) py= ;; esac; \
	  rows=$$(printf '%s\n' "$$rows" | tr ', ' '\n\n' | grep -v -e '^python$$' -e '^$$' | paste -sd, -); \
	  [ -n "$$rows" ] || kv=; fi; \
	if [ -n "$$kv" ]; then BENCH_ROWS="$$rows" $(B)/bench/kvc_bench || exit $$?; fi; \
	if [ -n "$$py" ]; then $(PY) tests/bench/py_bench.py $(B); fi

fuzz:
	@$(MAKE) --no-print-directory deps EXTRA_PACKAGES="clang libclang-rt-14-dev"
	@$(MAKE) --no-print-directory FUZZ=1 fuzz-build
	@tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# ---- install ------------------------------------------------------------------
# The unit's ExecStart names $(BINDIR)/kvcached; kvcached reads
# /etc/kvcached/kvcached.conf when it exists, so the example config goes to
# $(SYSCONFDIR)/kvcached/ (kept if already there) and to the doc directory.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
DOCDIR ?= $(DATADIR)/doc/kvcached
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
SYSCONFDIR ?= /etc
VERSION := $(shell sed -n 's/^\#define KVC_VERSION_STRING "\(.*\)"/\1/p' include/kvcache/kvcache.h)
SOVERSION := 1
INSTALL ?= install

# The dynamic linker finds a new library in a system directory only once
# ldconfig has run: install runs it there when installing for this system
# (DESTDIR empty, as root); a staged tree is the packager's to run it in.
LDCONFIG_DIRS := /lib /usr/lib /usr/local/lib /lib64 /usr/lib64 \
  /usr/lib/$(shell $(CC) -dumpmachine 2>/dev/null) /usr/local/lib/$(shell $(CC) -dumpmachine 2>/dev/null)
LDCONFIG_RUN := $(if $(DESTDIR),@true,$(if $(filter $(LDCONFIG_DIRS),$(LIBDIR:%/=%)),\
  if [ "$$(id -u)" = 0 ]; then ldconfig; else echo "run ldconfig as root: $(LIBDIR) is a system library directory"; fi,@true))

# kvcache.pc and the service's ExecStart= are written for this PREFIX.
install: $(B)/kvcached $(B)/kvcachectl $(B)/libkvcache.so $(B)/libkvcache.a
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)/kvcache \
	  $(DESTDIR)$(PKGCONFIGDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
	  $(DESTDIR)$(SYSCONFDIR)/kvcached $(DESTDIR)$(DOCDIR) \
	  $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8
	$(INSTALL) -m 0755 $(B)/kvcached $(B)/kvcachectl $(DESTDIR)$(BINDIR)/
	$(INSTALL) -m 0755 $(B)/libkvcache.so $(DESTDIR)$(LIBDIR)/libkvcache.so.$(SOVERSION).0.0
	ln -sf libkvcache.so.$(SOVERSION).0.0 $(DESTDIR)$(LIBDIR)/libkvcache.so.$(SOVERSION)
	ln -sf libkvcache.so.$(SOVERSION) $(DESTDIR)$(LIBDIR)/libkvcache.so
	$(INSTALL) -m 0644 $(B)/libkvcache.a $(DESTDIR)$(LIBDIR)/
	$(INSTALL) -m 0644 include/kvcache/*.h $(DESTDIR)$(INCLUDEDIR)/kvcache/
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: kvcache' \
	  'Description: client library of kvcached, the node-local KV-cache daemon' \
	  'Version: $(VERSION)' \
	  'Requires.private: libprotobuf-c' \
	  'Libs: -L$${libdir} -lkvcache' \
	  'Cflags: -I$${includedir}' > $(DESTDIR)$(PKGCONFIGDIR)/kvcache.pc
	sed 's|^ExecStart=/usr/local/bin/kvcached|ExecStart=$(BINDIR)/kvcached|' \
	  systemd/kvcached.service > $(DESTDIR)$(UNITDIR)/kvcached.service
	$(INSTALL) -m 0644 systemd/kvcached.socket $(DESTDIR)$(UNITDIR)/
	$(INSTALL) -m 0644 systemd/kvcached.sysusers $(DESTDIR)$(SYSUSERSDIR)/kvcached.conf
	$(INSTALL) -m 0644 systemd/kvcached.conf $(DESTDIR)$(DOCDIR)/kvcached.conf.example
	$(INSTALL) -m 0644 systemd/kvcached-network.conf $(DESTDIR)$(DOCDIR)/kvcached-network.conf
	$(INSTALL) -m 0644 doc/kvcached-alerts.yml doc/kvcached-dashboard.json $(DESTDIR)$(DOCDIR)/
	[ -e $(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf ] || \
	  $(INSTALL) -m 0644 systemd/kvcached.conf $(DESTDIR)$(SYSCONFDIR)/kvcached/kvcached.conf
	$(INSTALL) -m 0644 doc/kvcachectl.1 $(DESTDIR)$(MANDIR)/man1/
	$(INSTALL) -m 0644 doc/kvcached.8 $(DESTDIR)$(MANDIR)/man8/
	$(LDCONFIG_RUN)

# Leaves $(SYSCONFDIR)/kvcached/kvcached.conf: it may hold the operator's edits.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/kvcached $(DESTDIR)$(BINDIR)/kvcachectl \
	  $(DESTDIR)$(LIBDIR)/libkvcache.so* $(DESTDIR)$(LIBDIR)/libkvcache.a \
	  $(DESTDIR)$(PKGCONFIGDIR)/kvcache.pc $(DESTDIR)$(UNITDIR)/kvcached.service \
	  $(DESTDIR)$(UNITDIR)/kvcached.socket $(DESTDIR)$(SYSUSERSDIR)/kvcached.conf \
	  $(DESTDIR)$(DOCDIR)/kvcached.conf.example $(DESTDIR)$(DOCDIR)/kvcached-network.conf \
	  $(DESTDIR)$(MANDIR)/man1/kvcachectl.1 \
	  $(DESTDIR)$(DOCDIR)/kvcached-alerts.yml $(DESTDIR)$(DOCDIR)/kvcached-dashboard.json \
	  $(DESTDIR)$(MANDIR)/man8/kvcached.8
	rm -rf $(DESTDIR)$(INCLUDEDIR)/kvcache

# The example config is generated from the option table (a test checks it).
systemd/kvcached.conf: $(B)/kvcached
	$(B)/kvcached --example-config > $@

fuzz-build: $(FUZZ_BIN)

fuzz-corpus: deps
	@$(MAKE) --no-print-directory $(B)/tools/gen_corpus
	rm -rf tests/fuzz/corpus
	$(B)/tools/gen_corpus tests/fuzz/corpus

clean:
	rm -rf build build-asan build-fuzz build-vg

# Dependency files are made by the compiler, never by a rule.
%.d: ;
-include $(shell find $(B) -name '*.d' 2>/dev/null)
