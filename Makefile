# vmsan build and test entry points. `make test` is what CI runs (.ci/run).
#
#   make test    install missing test tools (as root, via apt-get), go vet,
#                all tests (race detector on the concurrent packages), a
#                short run of every fuzz target, and the multipath/HA guest
#                tests again on a guest kernel with scsi_dh_alua
#   make build   build bin/vmsan (version from `git describe`; see `vmsan version`)
#   make install binary, man pages, shell completions, systemd unit, docs
#                (DOCDIR), dashboard and alert rules (SHAREDIR) and a
#                default /etc/vmsan/vmsan.yaml (PREFIX=/usr/local, DESTDIR=)
#   make deb     bin/vmsan_VERSION_ARCH.deb (dpkg-deb) from `make install`
#   make fuzz    long fuzzing (FUZZTIME=5m per target by default)
#   make bench   Go benchmarks
#   make bench-check  the tests that assert a same-run ratio against another
#                program (fio, qemu-nbd): noisy on a loaded machine, so not
#                part of make test
#   make soak    long-running soak tests (VMSAN_SOAK=1): the daemon soak and
#                100 rounds of the replication fault loop (tests/repl)
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
RACE_RE   := /internal/(ioengine|nbd/server|nbd/client|nbd/nbdfront|repl|daemon|volrt|scsi|iscsi/target|iscsi/initiator|iscsi/iscsifront|role|control)(/|$$)

# Debian packages the tests drive (real NBD clients and servers, QEMU,
# filesystems for the loop-mount tests, certtool for TLS certificates,
# libiscsi's iscsi-inq/iscsi-ls/iscsi-test-cu for the iSCSI target's tests,
# QEMU's libiscsi block driver (qemu-block-extra; it has no program of its
# own for TOOLS), tgt (tgtd/tgtadm, the reference iSCSI target for the suite
# comparison, the initiator's tests and bench/iscsi-compare),
# systemd-analyze for the unit file check in packaging/, promtool from
# prometheus for the alert rules in docs/; dpkg-dev (dpkg-parsechangelog
# checks the .deb's changelog in packaging/); open-iscsi, multipath-tools,
# sg3-utils and bonnie++ whose binaries scripts/guest/build.sh --iscsi copies
# into the test guest: tests/iscsiguest starts iscsid and multipathd only
# inside that guest, never on the host. On a host with systemd, installing
# open-iscsi and multipath-tools enables their units; CI containers start none.
APT_PKGS  := qemu-utils qemu-system-x86 libnbd-bin nbdkit nbd-server nbd-client fio \
             busybox-static btrfs-progs xfsprogs cpio gnutls-bin kmod e2fsprogs libiscsi-bin systemd \
             prometheus qemu-block-extra tgt open-iscsi multipath-tools dmsetup sg3-utils bonnie++ jq dpkg-dev
# One program from each package above: if any is missing, install them all.
TOOLS     := qemu-img qemu-io qemu-nbd qemu-system-x86_64 nbdinfo nbdcopy nbdkit nbd-server \
             nbd-client fio busybox mkfs.btrfs mkfs.xfs cpio certtool modprobe mkfs.ext4 iscsi-inq systemd-analyze \
             promtool iscsi-test-cu tgtd iscsiadm multipath dmsetup sg_inq bonnie++ jq dpkg-parsechangelog

.PHONY: all build install deb deb-version test deps vet unit race fuzz-short alua-kernel fuzz bench bench-check soak clean scenarios

all: build

# Version stamped into the binary (internal/version). The revision is passed
# too because builds with -buildvcs=false or from a tarball embed none.
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo unknown)
REVISION  ?= $(shell git rev-parse HEAD 2>/dev/null)
# Man page dates (and so the .deb) follow the last commit, not the clock.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)
export SOURCE_DATE_EPOCH
VERSION_PKG := github.com/vmsan/vmsan/internal/version
LDFLAGS   := -X $(VERSION_PKG).Version=$(VERSION) -X $(VERSION_PKG).Revision=$(REVISION)
# Build outputs (tests redirect them to a temporary directory).
OUT       ?= bin

build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(OUT)/vmsan ./cmd/vmsan

# Install layout. systemd also reads units from /usr/local/lib/systemd/system,
# so PREFIX=/usr/local works for the unit too; its ExecStart and config path
# are rewritten to BINDIR and SYSCONFDIR. An existing vmsan.yaml is kept.
PREFIX     ?= /usr/local
DESTDIR    ?=
BINDIR     ?= $(PREFIX)/bin
MANDIR     ?= $(PREFIX)/share/man
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR  ?= $(PREFIX)/share/zsh/site-functions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
# Documentation (README.md, docs/*.md with their images: what the man pages'
# "docs/NAME.md" refer to) and the monitoring files used as they are: the
# Grafana dashboard and the Prometheus alert rules.
DOCDIR     ?= $(PREFIX)/share/doc/vmsan
SHAREDIR   ?= $(PREFIX)/share/vmsan
DOCS       := $(wildcard docs/*.md docs/*.png) docs/vmsan.example.yaml

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR) $(DESTDIR)$(SYSCONFDIR)/vmsan \
		$(DESTDIR)$(DOCDIR)/docs $(DESTDIR)$(SHAREDIR)
	install -m 0755 $(OUT)/vmsan $(DESTDIR)$(BINDIR)/vmsan
	$(OUT)/vmsan gen-man --doc-dir $(DOCDIR) --share-dir $(SHAREDIR) --config-path $(SYSCONFDIR)/vmsan/vmsan.yaml $(DESTDIR)$(MANDIR)/man1
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	install -m 0644 $(DOCS) $(DESTDIR)$(DOCDIR)/docs/
	install -m 0644 docs/grafana-dashboard.json docs/prometheus-alerts.yaml $(DESTDIR)$(SHAREDIR)/
	$(OUT)/vmsan completion bash > $(DESTDIR)$(BASHCOMPDIR)/vmsan
	$(OUT)/vmsan completion zsh > $(DESTDIR)$(ZSHCOMPDIR)/_vmsan
	$(OUT)/vmsan completion fish > $(DESTDIR)$(FISHCOMPDIR)/vmsan.fish
	sed -e 's#/usr/bin/vmsan#$(BINDIR)/vmsan#' -e 's#/etc/vmsan/#$(SYSCONFDIR)/vmsan/#' \
		packaging/vmsan.service > $(DESTDIR)$(UNITDIR)/vmsan.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/vmsan.service
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/vmsan/vmsan.yaml ]; then \
		echo "install: keeping existing $(DESTDIR)$(SYSCONFDIR)/vmsan/vmsan.yaml"; \
	else install -m 0644 packaging/vmsan.yaml $(DESTDIR)$(SYSCONFDIR)/vmsan/vmsan.yaml; fi

# A Debian package built with dpkg-deb only (no debhelper): the tree `make
# install` produces under PREFIX=/usr, plus packaging/deb/. The version is
# `git describe` made Debian-legal and ordered (packaging/deb/version.sh:
# v1.2.3-4-gabc -> 1.2.3+4.gabc; an untagged tree gives
# 0.0.0+gitYYYYMMDD.HHMMSS.REV, the commit time first so that dpkg orders
# builds). Debian policy's /usr/share/doc/vmsan: copyright, changelog.gz
# (one entry for this build) and documents over 4 KiB compressed.
DEBROOT    ?= $(OUT)/deb-root
DEB_ARCH   ?= $(shell dpkg --print-architecture 2>/dev/null || $(GO) env GOARCH)
DEB_VERSION ?= $(shell sh packaging/deb/version.sh '$(VERSION)' '$(SOURCE_DATE_EPOCH)')
DEB        := $(OUT)/vmsan_$(DEB_VERSION)_$(DEB_ARCH).deb
DEB_DOC    := $(DEBROOT)/usr/share/doc/vmsan

# The version `make deb` would give this tree (packaging tests use it).
deb-version:
	@echo '$(DEB_VERSION)'

deb:
	rm -rf $(DEBROOT)
	$(MAKE) install DESTDIR=$(DEBROOT) PREFIX=/usr ZSHCOMPDIR=/usr/share/zsh/vendor-completions
	gzip -9n $(DEBROOT)/usr/share/man/man1/*.1
	install -m 0644 packaging/deb/copyright $(DEB_DOC)/copyright
	{ echo 'vmsan ($(DEB_VERSION)) unstable; urgency=medium'; echo; \
	  echo '  * Build of $(VERSION) (commit $(REVISION)).'; echo; \
	  echo " -- vmsan developers <vmsan@localhost>  $$(date -u -R -d @$${SOURCE_DATE_EPOCH:-0})"; } | gzip -9n > $(DEB_DOC)/changelog.gz
	find $(DEB_DOC) -type f -size +4k \( -name '*.md' -o -name '*.yaml' \) -exec gzip -9n {} +
	install -d $(DEBROOT)/DEBIAN
	install -m 0644 packaging/deb/conffiles $(DEBROOT)/DEBIAN/conffiles
	install -m 0755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm $(DEBROOT)/DEBIAN/
	sed -e 's/@VERSION@/$(DEB_VERSION)/' -e 's/@ARCH@/$(DEB_ARCH)/' \
		-e "s/@SIZE@/$$(du -sk --exclude=DEBIAN $(DEBROOT) | cut -f1)/" \
		packaging/deb/control.in > $(DEBROOT)/DEBIAN/control
	dpkg-deb --root-owner-group -Zgzip --build $(DEBROOT) $(DEB)
	@echo "deb: $(DEB)"

test: deps vet unit race fuzz-short alua-kernel
	@echo "make test: all steps passed"

# The multipath and HA-pair guest tests once more on Debian's generic
# kernel, which has scsi_dh_alua (the kernel side of ALUA that Debian hosts
# run; the default cloud kernel has no CONFIG_SCSI_DH): the map's "1 alua"
# handler is then live. A 70 MB download on a fresh machine (cached in
# .cache/). It found the open-iscsi reconnect wedge the cloud kernel showed
# once in 32 runs.
alua-kernel:
	VMSAN_GUEST_KERNEL=generic $(GO) test -count=1 -timeout $(TIMEOUT) -run 'TestGuestMultipath/vmsan|TestGuestPairFailover' ./tests/iscsiguest/

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

# Ratio checks against other programs, one package at a time so they do
# not compete with each other for the cores they measure.
BENCH_CHECK_RE := TestFioParity|TestQemuSequential4KWritesVsQemuNBD
bench-check:
	VMSAN_BENCH_CHECK=1 $(GO) test -count=1 -timeout $(TIMEOUT) -p 1 -run '$(BENCH_CHECK_RE)' ./internal/bench/ ./tests/interop/

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
