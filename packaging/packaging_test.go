// Package packaging_test checks what `make install` and `make deb` ship:
// the .deb builds with dpkg-deb, installs into a scratch root with dpkg,
// the installed binary carries the Makefile's version, the default config
// loads, and the systemd unit passes `systemd-analyze verify`.
package packaging_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/testutil"
)

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestMakeDeb(t *testing.T) {
	for _, tool := range []string{"make", "dpkg-deb", "dpkg", "gzip", "systemd-analyze"} {
		testutil.NeedTool(t, tool)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	version := "v1.2.3-4-gabcdef0"
	log := run(t, repo, "make", "deb", "OUT="+out, "VERSION="+version)
	deb := filepath.Join(out, "vmsan_1.2.3+4.gabcdef0_"+strings.TrimSpace(run(t, repo, "dpkg", "--print-architecture"))+".deb")
	if _, err := os.Stat(deb); err != nil {
		t.Fatalf("no %s: %v\n%s", deb, err, log)
	}
	list := run(t, repo, "dpkg-deb", "-c", deb)
	for _, want := range []string{
		"./usr/bin/vmsan", "./usr/share/man/man1/vmsan-serve.1.gz", "./usr/share/man/man1/vmsan.1.gz",
		"./usr/share/bash-completion/completions/vmsan", "./usr/share/zsh/vendor-completions/_vmsan",
		"./usr/share/fish/vendor_completions.d/vmsan.fish", "./usr/lib/systemd/system/vmsan.service", "./etc/vmsan/vmsan.yaml",
	} {
		if !strings.Contains(list, want+"\n") {
			t.Errorf("package lacks %s:\n%s", want, list)
		}
	}
	if info := run(t, repo, "dpkg-deb", "-f", deb, "Package", "Version"); info != "Package: vmsan\nVersion: 1.2.3+4.gabcdef0\n" {
		t.Errorf("control fields:\n%s", info)
	}
	if cf := run(t, repo, "dpkg-deb", "-I", deb, "conffiles"); strings.TrimSpace(cf) != "/etc/vmsan/vmsan.yaml" {
		t.Errorf("conffiles: %q", cf)
	}

	// Install into a scratch root: dpkg's own database there, maintainer
	// scripts run outside a chroot with DPKG_ROOT set (they then do
	// nothing), no root privileges needed.
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "var/lib/dpkg/status"), nil, 0o644)
	run(t, repo, "dpkg", "--root="+root, "--log=/dev/null", "--force-not-root", "--force-script-chrootless", "-i", deb)
	if st := run(t, repo, "dpkg", "--root="+root, "-s", "vmsan"); !strings.Contains(st, "Status: install ok installed") {
		t.Fatalf("dpkg -s:\n%s", st)
	}
	bin := filepath.Join(root, "usr/bin/vmsan")
	if v := run(t, repo, bin, "version"); !strings.HasPrefix(v, "vmsan "+version+"\n") {
		t.Errorf("installed vmsan version:\n%s", v)
	}
	cfg := run(t, repo, bin, "serve", "--config", filepath.Join(root, "etc/vmsan/vmsan.yaml"), "--print-config")
	if !strings.Contains(cfg, "data_dir: /var/lib/vmsan\n") {
		t.Errorf("default config:\n%s", cfg)
	}

	// The installed unit, pointed at the installed binary (verify checks
	// that ExecStart exists and is executable).
	unit, err := os.ReadFile(filepath.Join(root, "usr/lib/systemd/system/vmsan.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Type=notify", "ExecStart=/usr/bin/vmsan serve --config /etc/vmsan/vmsan.yaml", "ExecReload=/bin/kill -HUP $MAINPID", "StateDirectory=vmsan"} {
		if !strings.Contains(string(unit), want+"\n") {
			t.Errorf("unit lacks %q", want)
		}
	}
	ud := t.TempDir()
	up := filepath.Join(ud, "vmsan.service")
	os.WriteFile(up, []byte(strings.ReplaceAll(string(unit), "/usr/bin/vmsan", bin)), 0o644)
	cmd := exec.Command("systemd-analyze", "verify", "--man=no", up)
	vout, err := cmd.CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(vout))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, vout)
	}
}
