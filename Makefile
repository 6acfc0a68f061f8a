# vmsan build and test entry points. `make test` is what CI runs (.ci/run).
#
#   make test    install missing test tools (as root, via apt-get), go vet,
#                all tests (race detector on the concurrent packages), and a
#                short run of every fuzz target
#   make build   build bin/vmsan
#   make fuzz    long fuzzing (FUZZTIME=5m per target by default)
#   make bench   Go benchmarks
#   make soak    long-running soak tests (VMSAN_SOAK=1)
#   make scenarios  the replayed field cases (scenarios/*.sh, root; not part of test)
#
# Output is plain `go test` output so that CI logs end with the summary lines.

GO        ?= go
# The short CI run is a count of executions, not a duration: with a
# duration, `go test -fuzz` can fail at the deadline with "context deadline
# exceeded" while a worker is busy (a toolchain flake, not a finding).
# 20000 inputs is ~0.5 s for the codec targets and ~10 s for FuzzServerConn.
FUZZTIME  ?= 20000x
TIMEOUT   ?= 25m
# Packages whose tests exercise concurrency get -race (slower, so not all).
RACE_RE   := /internal/(ioengine|nbd/server|nbd/client|repl|daemon)(/|$$)

# Debian packages the tests drive (real NBD clients and servers, QEMU,
# filesystems for the loop-mount tests, certtool for TLS certificates).
APT_PKGS  := qemu-utils qemu-system-x86 libnbd-bin nbdkit nbd-server nbd-client fio \
             busybox-static btrfs-progs xfsprogs cpio gnutls-bin kmod e2fsprogs
# One program from each package above: if any is missing, install them all.
TOOLS     := qemu-img qemu-io qemu-nbd qemu-system-x86_64 nbdinfo nbdcopy nbdkit nbd-server \
             nbd-client fio busybox mkfs.btrfs mkfs.xfs cpio certtool modprobe mkfs.ext4

.PHONY: all build test deps vet unit race fuzz-short fuzz bench soak clean scenarios

all: build

build:
	$(GO) build -o bin/vmsan ./cmd/vmsan

test: deps vet unit race fuzz-short
	@echo "make test: all steps passed"

deps:
	@missing=""; for t in $(TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "deps: missing$$missing; installing with apt-get"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -q && apt-get install -y -q --no-install-recommends $(APT_PKGS); \
		else \
			echo "deps: WARNING: missing$$missing (run make deps as root to install; tests needing them fail in CI)"; \
		fi; \
	fi
	$(GO) mod download

vet:
	$(GO) vet ./...

# Everything except the race packages, without -race.
unit:
	$(GO) test -count=1 -timeout $(TIMEOUT) $$($(GO) list ./... | grep -Ev '$(RACE_RE)')

# The engine's merge tests measure a scheduling policy (write gathering), so
# the engine package runs alone, not beside another -race test binary that
# competes for the two CI cores; the rest run in parallel as usual.
ENGINE_PKG := ./internal/ioengine/...
race:
	$(GO) test -race -count=1 -timeout $(TIMEOUT) $(ENGINE_PKG)
	@pkgs=$$($(GO) list ./... | grep -E '$(RACE_RE)' | grep -v '/internal/ioengine'); \
	if [ -n "$$pkgs" ]; then echo "$(GO) test -race $$pkgs"; $(GO) test -race -count=1 -timeout $(TIMEOUT) $$pkgs; fi

# Each fuzz target (found by grepping for `func Fuzz`) for FUZZTIME.
define run_fuzz
	@set -e; for dir in $$(grep -rl --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '^./.cache/' | xargs -r -n1 dirname | sort -u); do \
		for f in $$(grep -h -oE '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go | sed 's/^func //'); do \
			echo "fuzz $$dir $$f ($(1))"; \
			$(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(1) $$dir; \
		done; \
	done
endef

fuzz-short:
	$(call run_fuzz,$(FUZZTIME))

fuzz:
	$(call run_fuzz,$(if $(filter 20000x,$(FUZZTIME)),5m,$(FUZZTIME)))

bench:
	$(GO) test -run '^$$' -bench . -benchmem -timeout 60m ./...

soak:
	VMSAN_SOAK=1 $(GO) test -count=1 -run Soak -timeout 3h ./...

# The replayed field cases (docs/scenarios.md): each script ≤ 10 min on 2 cores,
# needs root (loop devices, cgroups), writes to scenarios/out/. Not part of
# `make test`: they measure, they do not assert.
scenarios:
	scenarios/000-iscsi-multipath.sh
	scenarios/001-filesystems.sh
	scenarios/002-replication.sh

clean:
	rm -rf bin
