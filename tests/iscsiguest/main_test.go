// Package iscsiguest_test boots a QEMU TCG guest whose initramfs carries Linux's
// own iSCSI initiator (open-iscsi's iscsid/iscsiadm, the kernel's
// iscsi_tcp), dm-multipath (multipath-tools) and sg3-utils, and runs it
// against an iSCSI target on the host: discovery (with CHAP), CHAP login,
// SCSI identity and persistent reservations, O_DIRECT pattern I/O,
// discard, logout, the target restarted (gracefully, then kill -9) with
// the data intact, and the golden-vector session (TestGuestLogin), two
// paths under dm-multipath with one path cut and restored while a writer
// runs (TestGuestMultipath), and a replicated pair of vmsan nodes as one
// logical unit on two paths, its primary killed and its secondary
// promoted while a writer runs (TestGuestPairFailover, vmsan only).
//
// The guest is scripts/guest/build.sh --iscsi (cached in .cache/guest-iscsi);
// each test appends a second archive with its script (testdata/*.sh) and a
// /test.env naming the target, and reads the guest's "VMSAN-GUEST:" lines
// from the serial console. QEMU's user mode network gives the guest the
// host's loopback at 10.0.2.2, so the target listens on 127.0.0.1 and
// nothing on the host is logged in to anything.
//
// The targets under test: TestGuestLogin and TestGuestMultipath run as
// subtests "tgt" and "vmsan",
// one per target; VMSAN_ISCSI_TARGET=tgt, vmsan or external runs only
// that one. tgt starts tgtd (Linux SCSI target framework) on a file, in
// the foreground, with its own portal and control port. vmsan builds
// cmd/vmsan and starts `vmsan serve` with one volume and two portals in
// two portal groups (implicit ALUA, both active/optimized), each path of
// the multipath test on its own portal. external uses a target that is
// already running: VMSAN_ISCSI_PORTAL (host:port on this host),
// optionally VMSAN_ISCSI_PORTAL2 (a second portal for the multipath
// test's second path; default the first), VMSAN_ISCSI_IQN,
// VMSAN_ISCSI_USER/VMSAN_ISCSI_SECRET (CHAP, both required),
// VMSAN_ISCSI_VENDOR/VMSAN_ISCSI_PRODUCT (what its INQUIRY answers;
// default VMSAN/vmsan), optionally VMSAN_ISCSI_BACKING (the file behind
// the LU, for the host-side checks) and VMSAN_ISCSI_ALUA=1 (the target
// reports implicit ALUA: with a guest kernel that has scsi_dh_alua the
// multipath map must then use the "1 alua" hardware handler).
//
// Run it with:
//
//	go test ./tests/iscsiguest/
//
// A missing tool (tgtd, tgtadm, iscsiadm, multipath, sg_inq,
// qemu-system-x86_64, cpio) fails the tests in CI and skips them locally.
package iscsiguest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var repoRoot string

func TestMain(m *testing.M) {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	os.Exit(m.Run())
}
