// Package packaging_test checks what `make install` and `make deb` ship:
// the .deb builds with dpkg-deb, installs into a scratch root with dpkg,
// the installed binary carries the Makefile's version, the default config
// loads, the systemd unit passes `systemd-analyze verify`, the package has
// Debian policy's /usr/share/doc/vmsan and the monitoring files the man
// pages name, its versions order under dpkg, and the commands the shipped
// configuration's comments show work.
package packaging_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
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
	for _, tool := range []string{"make", "dpkg-deb", "dpkg", "gzip", "systemd-analyze", "dpkg-parsechangelog"} {
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
		// Debian policy 12.5 and 12.7: copyright uncompressed, the
		// changelog and large documents compressed.
		"./usr/share/doc/vmsan/copyright", "./usr/share/doc/vmsan/changelog.gz", "./usr/share/doc/vmsan/README.md.gz",
		"./usr/share/doc/vmsan/docs/replication.md.gz", "./usr/share/doc/vmsan/docs/bench.md.gz", "./usr/share/doc/vmsan/docs/iscsi.md.gz",
		// Used as they are (Grafana import, Prometheus rule_files).
		"./usr/share/vmsan/grafana-dashboard.json", "./usr/share/vmsan/prometheus-alerts.yaml",
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
	// The monitoring files are the repository's, byte for byte; every
	// document the help texts name as docs/NAME.md is installed.
	for inst, src := range map[string]string{
		"usr/share/vmsan/grafana-dashboard.json": "docs/grafana-dashboard.json",
		"usr/share/vmsan/prometheus-alerts.yaml": "docs/prometheus-alerts.yaml",
	} {
		a, err := os.ReadFile(filepath.Join(root, inst))
		b, _ := os.ReadFile(filepath.Join(repo, src))
		if err != nil || !bytes.Equal(a, b) || len(a) == 0 {
			t.Errorf("/%s differs from %s (%v)", inst, src, err)
		}
	}
	docRef := regexp.MustCompile(`docs/([a-z0-9-]+)\.md`)
	manDir := filepath.Join(root, "usr/share/man/man1")
	pages, _ := filepath.Glob(filepath.Join(manDir, "*.1.gz"))
	if len(pages) == 0 {
		t.Fatal("no man pages installed")
	}
	for _, p := range pages {
		text := gunzip(t, p)
		for _, m := range docRef.FindAllStringSubmatch(text, -1) {
			d := filepath.Join(root, "usr/share/doc/vmsan/docs", m[1]+".md")
			if _, err := os.Stat(d); err != nil {
				if _, err := os.Stat(d + ".gz"); err != nil {
					t.Errorf("%s names %s, which is not installed", filepath.Base(p), m[0])
				}
			}
		}
		for _, f := range []string{"/usr/share/doc/vmsan/", "/usr/share/vmsan/grafana-dashboard.json", "/usr/share/vmsan/prometheus-alerts.yaml", "/etc/vmsan/vmsan.yaml"} {
			if !strings.Contains(text, ".SH FILES") || !strings.Contains(text, f) {
				t.Errorf("%s: FILES does not name %s", filepath.Base(p), f)
			}
			if _, err := os.Stat(filepath.Join(root, f)); err != nil {
				t.Errorf("%s names %s: %v", filepath.Base(p), f, err)
			}
		}
	}
	// The changelog is a Debian changelog of this version.
	cl := filepath.Join(t.TempDir(), "changelog")
	os.WriteFile(cl, []byte(gunzip(t, filepath.Join(root, "usr/share/doc/vmsan/changelog.gz"))), 0o644)
	if v := run(t, repo, "dpkg-parsechangelog", "-l", cl, "-S", "Version"); strings.TrimSpace(v) != "1.2.3+4.gabcdef0" {
		t.Errorf("changelog version %q", v)
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

func gunzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(b)
}

// TestDebVersionOrder: the versions `make deb` gives successive builds
// order under dpkg (an upgrade must install a newer build, and dpkg cannot
// order bare commit hashes): untagged builds by commit time, every tagged
// release after them, builds after a tag by their distance from it.
func TestDebVersionOrder(t *testing.T) {
	for _, tool := range []string{"make", "dpkg"} {
		testutil.NeedTool(t, tool)
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	debVersion := func(describe string, epoch int64) string {
		return strings.TrimSpace(run(t, repo, "make", "-s", "deb-version", "VERSION="+describe, "SOURCE_DATE_EPOCH="+strconv.FormatInt(epoch, 10)))
	}
	const day = 86400
	base := int64(1796162375)
	// Oldest first. The hashes are chosen against their order (a later
	// commit with a "smaller" hash), as real hashes are.
	builds := []struct {
		describe string
		epoch    int64
	}{
		{"f00dbee", base},
		{"f00dbee-dirty", base},
		{"0b96df6", base + 60},
		{"9abcdef", base + day},
		{"12ab34c", base + 30*day},
		{"v0.1.0", base + 31*day},
		{"v0.1.0-2-gdeadbee", base + 32*day},
		{"v0.1.0-10-g0123456", base + 33*day},
		{"v0.2.0", base + 34*day},
	}
	var vs []string
	for _, b := range builds {
		v := debVersion(b.describe, b.epoch)
		if !regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`).MatchString(v) {
			t.Fatalf("%s: %q is not a Debian version", b.describe, v)
		}
		vs = append(vs, v)
	}
	t.Logf("versions: %q", vs)
	if vs[0] != "0.0.0+git20261201.215935.f00dbee" || vs[5] != "0.1.0" || vs[6] != "0.1.0+2.gdeadbee" {
		t.Errorf("versions %q", vs)
	}
	for i := 1; i < len(vs); i++ {
		if err := exec.Command("dpkg", "--compare-versions", vs[i-1], "lt", vs[i]).Run(); err != nil {
			t.Errorf("dpkg does not order %s (%s) before %s (%s)", vs[i-1], builds[i-1].describe, vs[i], builds[i].describe)
		}
	}
}

// TestConfigCommentCommands runs every `vmsan ...` command that the
// shipped configuration's comments show, with its placeholders filled in
// and /var/lib/vmsan replaced by a scratch data directory: advice in the
// file an admin reads first must work as written.
func TestConfigCommentCommands(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repo, "packaging/vmsan.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds [][]string
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, m := range regexp.MustCompile("`(vmsan [^`]+)`").FindAllStringSubmatch(line, -1) {
			cmds = append(cmds, strings.Fields(m[1]))
		}
	}
	if len(cmds) == 0 {
		t.Fatal("no `vmsan ...` command found in the comments of packaging/vmsan.yaml")
	}
	bin, cleanup, err := testutil.BuildVmsan()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	dataDir := t.TempDir()
	fill := map[string]string{"NAME": "vm1", "SIZE": "1G", "/var/lib/vmsan": dataDir}
	for _, c := range cmds {
		args := make([]string, 0, len(c)-1)
		for _, a := range c[1:] {
			if v, ok := fill[a]; ok {
				a = v
			} else if a == strings.ToUpper(a) && regexp.MustCompile(`^[A-Z]+$`).MatchString(a) {
				t.Fatalf("command %q: no value for the placeholder %s (add it to the test)", strings.Join(c, " "), a)
			}
			args = append(args, a)
		}
		t.Logf("vmsan %s", strings.Join(args, " "))
		run(t, repo, bin, args...)
	}
	// The volume the advice creates is there, of the size asked.
	if out := run(t, repo, bin, "volume", "list", "--data-dir", dataDir); !strings.Contains(out, "vm1") || !strings.Contains(out, "1.0 GiB") && !strings.Contains(out, "1 GiB") {
		t.Errorf("volume list after the documented commands:\n%s", out)
	}
}
