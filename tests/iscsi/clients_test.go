package iscsi

import (
	"bytes"
	"fmt"
	"github.com/vmsan/vmsan/internal/testutil"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDiscoveryInquiry(t *testing.T) {
	t.Parallel()
	v := startVmsan(t, "")
	out, err := run(t, 30*time.Second, "iscsi-ls", "-s", "iscsi://"+v.addr)
	if err != nil {
		t.Fatalf("iscsi-ls: %v\n%s", err, out)
	}
	if want := fmt.Sprintf("Target:%s Portal:%s,1", nodeIQN, v.addr); !strings.Contains(out, want) ||
		!strings.Contains(out, "Lun:0") || !strings.Contains(out, "DIRECT_ACCESS") {
		t.Fatalf("iscsi-ls lacks %q and LUN 0:\n%s", want, out)
	}
	out, err = run(t, 30*time.Second, "iscsi-inq", v.url("", 0))
	if err != nil || !strings.Contains(out, "VMSAN") {
		t.Fatalf("iscsi-inq: %v\n%s", err, out)
	}
	out, err = run(t, 30*time.Second, "iscsi-readcapacity16", v.url("", 0))
	if err != nil || !strings.Contains(out, fmt.Sprint(volSize)) {
		t.Fatalf("iscsi-readcapacity16: %v\n%s", err, out)
	}
}

// TestCHAP: discovery CHAP and per-target CHAP (secrets from a file for
// one of them); a wrong secret and no secret are refused.
func TestCHAP(t *testing.T) {
	t.Parallel()
	sec := filepath.Join(t.TempDir(), "target.secret")
	if err := os.WriteFile(sec, []byte("targetsecret99\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v := startVmsan(t, fmt.Sprintf(`    discovery_auth: {user: disc, secret: "discsecret123"}
    auth: {user: vm1, secret_file: %s, mutual_user: san1, mutual_secret: "mutualsecret9"}
`, sec))
	ok := func(out string, err error) bool { return err == nil && strings.Contains(out, nodeIQN) }
	if out, err := run(t, 30*time.Second, "iscsi-ls", "iscsi://disc%discsecret123@"+v.addr); !ok(out, err) {
		t.Fatalf("discovery with the right secret: %v\n%s", err, out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-ls", "iscsi://disc%wrongsecret99@"+v.addr); ok(out, err) {
		t.Fatalf("discovery with a wrong secret succeeded:\n%s", out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-ls", "iscsi://"+v.addr); ok(out, err) {
		t.Fatalf("discovery without CHAP succeeded:\n%s", out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-inq", v.url("vm1%targetsecret99", 0)); err != nil || !strings.Contains(out, "VMSAN") {
		t.Fatalf("login with CHAP: %v\n%s", err, out)
	}
	// Mutual CHAP: libiscsi checks the target's answer.
	if out, err := run(t, 30*time.Second, "iscsi-inq", v.url("vm1%targetsecret99", 0)+"?target_user=san1&target_password=mutualsecret9"); err != nil || !strings.Contains(out, "VMSAN") {
		t.Fatalf("login with mutual CHAP: %v\n%s", err, out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-inq", v.url("vm1%targetsecret99", 0)+"?target_user=san1&target_password=mutualsecret8"); err == nil {
		t.Fatalf("initiator accepted a target that does not know the mutual secret:\n%s", out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-inq", v.url("vm1%targetsecret98", 0)); err == nil {
		t.Fatalf("login with a wrong secret succeeded:\n%s", out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-inq", v.url("", 0)); err == nil {
		t.Fatalf("login without CHAP succeeded:\n%s", out)
	}
}

// TestQEMU: qemu-io writes patterns through QEMU's libiscsi driver (sizes
// that need immediate data, unsolicited Data-Out and several R2Ts; CRC32C
// digests on one run), qemu-img converts the LUN to a file and compares
// it with the LUN and with the volume's raw file.
func TestQEMU(t *testing.T) {
	t.Parallel()
	for _, dig := range []string{"none", "crc32c"} {
		t.Run(dig, func(t *testing.T) {
			v := startVmsan(t, "")
			url := v.url("", 0)
			opts := fmt.Sprintf("driver=iscsi,transport=tcp,portal=%s,target=%s,lun=0,header-digest=%s", v.addr, nodeIQN, dig)
			if out, err := run(t, 60*time.Second, "qemu-img", "info", url); err != nil || !strings.Contains(out, "64 MiB") {
				t.Fatalf("qemu-img info: %v\n%s", err, out)
			}
			out, err := run(t, 120*time.Second, "qemu-io", "--image-opts", opts,
				"-c", "write -P 0xa5 0 3M", "-c", "write -P 0x5a 3M 4k",
				"-c", "aio_write -P 0x11 8M 64k", "-c", "aio_write -P 0x22 9M 2M", "-c", "aio_write -P 0x33 20M 512",
				"-c", "aio_flush",
				"-c", "read -P 0xa5 0 3M", "-c", "read -P 0x5a 3M 4k", "-c", "read -P 0x11 8M 64k",
				"-c", "read -P 0x22 9M 2M", "-c", "read -P 0x33 20M 512", "-c", "read -P 0 32M 1M")
			if err != nil || strings.Contains(out, "fail") || strings.Contains(out, "error") {
				t.Fatalf("qemu-io: %v\n%s", err, out)
			}
			copyFile := filepath.Join(t.TempDir(), "copy.raw")
			if out, err := run(t, 120*time.Second, "qemu-img", "convert", "-O", "raw", url, copyFile); err != nil {
				t.Fatalf("qemu-img convert: %v\n%s", err, out)
			}
			if out, err := run(t, 120*time.Second, "qemu-img", "compare", "-f", "raw", "-F", "raw", copyFile, url); err != nil {
				t.Fatalf("qemu-img compare: %v\n%s", err, out)
			}
			got, err := os.ReadFile(copyFile)
			if err != nil || len(got) != volSize {
				t.Fatalf("copy: %d bytes, %v", len(got), err)
			}
			want := make([]byte, volSize)
			copy(want, bytes.Repeat([]byte{0xa5}, 3<<20))
			copy(want[3<<20:], bytes.Repeat([]byte{0x5a}, 4096))
			copy(want[8<<20:], bytes.Repeat([]byte{0x11}, 64<<10))
			copy(want[9<<20:], bytes.Repeat([]byte{0x22}, 2<<20))
			copy(want[20<<20:], bytes.Repeat([]byte{0x33}, 512))
			if !bytes.Equal(got, want) {
				t.Fatal("the LUN's content is not the pattern qemu-io wrote")
			}
			// Writes reached the volume: stop the daemon (engine drain)
			// and compare its raw file.
			v.stop(t)
			raw, err := os.ReadFile(v.raw)
			if err != nil || !bytes.Equal(raw, want) {
				t.Fatalf("volume raw file differs from what was written (err %v)", err)
			}
		})
	}
}

// lunSizes parses `iscsi-ls -s` into LUN number -> size text per target.
func lunSizes(out string) map[string]map[string]string {
	res := map[string]map[string]string{}
	cur := ""
	for _, l := range lines(out) {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "Target:") {
			cur = strings.TrimPrefix(f[0], "Target:")
			res[cur] = map[string]string{}
			continue
		}
		if strings.HasPrefix(f[0], "Lun:") && cur != "" {
			size := ""
			if i := strings.Index(l, "(Size:"); i >= 0 {
				size = strings.TrimSuffix(l[i+len("(Size:"):], ")")
			}
			res[cur][strings.TrimPrefix(f[0], "Lun:")] = size
		}
	}
	return res
}

// TestNodeModeStableLUNs: in node mode each volume keeps its LUN number
// across a restart that adds a volume sorting before the others.
func TestNodeModeStableLUNs(t *testing.T) {
	t.Parallel()
	dir := testutil.DiskTempDir(t)
	v := startVmsanIn(t, dir, "  - {name: zeta, size: 8M}\n", "")
	out, err := run(t, 30*time.Second, "iscsi-ls", "-s", "iscsi://"+v.addr)
	if err != nil {
		t.Fatalf("iscsi-ls: %v\n%s", err, out)
	}
	before := lunSizes(out)[nodeIQN]
	if len(before) != 2 || before["0"] == "" || before["1"] == "" {
		t.Fatalf("want 2 LUNs, got %v\n%s", before, out)
	}
	v.stop(t)
	v = startVmsanIn(t, dir, "  - {name: zeta, size: 8M}\n  - {name: alpha, size: 16M}\n", "")
	out, err = run(t, 30*time.Second, "iscsi-ls", "-s", "iscsi://"+v.addr)
	if err != nil {
		t.Fatalf("iscsi-ls: %v\n%s", err, out)
	}
	after := lunSizes(out)[nodeIQN]
	if len(after) != 3 || after["0"] != before["0"] || after["1"] != before["1"] || after["2"] == "" {
		t.Fatalf("LUNs moved: before %v after %v\n%s", before, after, out)
	}
}

// TestPerVolumeMode: one target per volume, each with its volume as LUN 0;
// a per-volume ACL hides a target from other initiators.
func TestPerVolumeMode(t *testing.T) {
	t.Parallel()
	v := startVmsanIn(t, testutil.DiskTempDir(t), "  - {name: Zeta, size: 8M}\n", `    mode: per-volume
    targets:
      - {volume: Zeta, initiators: [iqn.2026-11.org.example:allowed]}
`)
	out, err := run(t, 30*time.Second, "iscsi-ls", "-s", "iscsi://"+v.addr)
	if err != nil {
		t.Fatalf("iscsi-ls: %v\n%s", err, out)
	}
	got := lunSizes(out)
	if len(got) != 1 || got[nodeIQN+":disk"]["0"] == "" {
		t.Fatalf("want only %s:disk (Zeta is ACL'd), got %v\n%s", nodeIQN, got, out)
	}
	out, err = run(t, 30*time.Second, "iscsi-ls", "-s", "-i", "iqn.2026-11.org.example:allowed", "iscsi://"+v.addr)
	if err != nil {
		t.Fatalf("iscsi-ls: %v\n%s", err, out)
	}
	if got := lunSizes(out); len(got) != 2 || got[nodeIQN+":zeta"]["0"] == "" {
		t.Fatalf("the allowed initiator should see both targets: %v\n%s", got, out)
	}
	if out, err := run(t, 30*time.Second, "iscsi-inq", fmt.Sprintf("iscsi://%s/%s:zeta/0", v.addr, nodeIQN)); err == nil {
		t.Fatalf("login to an ACL'd target succeeded:\n%s", out)
	}
}
