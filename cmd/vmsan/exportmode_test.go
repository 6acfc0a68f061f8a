package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/vmsan/vmsan/internal/testutil"
)

// TestExportMode: every export (raw, qcow2, vmdk) is 0600 whatever the
// umask (022 and 000 tried), also when --force overwrites a wider file;
// --mode gives another mode.
func TestExportMode(t *testing.T) {
	testutil.NeedTool(t, "qemu-img")
	tmp := t.TempDir()
	data := filepath.Join(tmp, "data")
	vmsan(t, "volume", "import", "--data-dir", data, "-q", "v", sparseImage(t, tmp))
	export := func(umask string, args ...string) {
		t.Helper()
		sh := `umask ` + umask + ` && exec "$0" "$@"`
		if out, err := exec.Command("sh", append([]string{"-c", sh, binary(t), "volume", "export", "--data-dir", data, "-q"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("umask %s; vmsan volume export %v: %v\n%s", umask, args, err, out)
		}
	}
	mode := func(p string) os.FileMode {
		t.Helper()
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return st.Mode().Perm()
	}
	for _, umask := range []string{"022", "000"} {
		for _, f := range []string{"raw", "qcow2", "vmdk"} {
			out := filepath.Join(tmp, umask+"."+f)
			export(umask, "-O", f, "v", out)
			if m := mode(out); m != 0o600 {
				t.Errorf("umask %s, -O %s: mode %04o, want 0600", umask, f, m)
			}
		}
	}
	wide := filepath.Join(tmp, "wide.qcow2")
	if err := os.WriteFile(wide, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(wide, 0o666)
	export("000", "-O", "qcow2", "--force", "v", wide)
	if m := mode(wide); m != 0o600 {
		t.Errorf("--force over a 0666 file: mode %04o, want 0600", m)
	}
	for _, f := range []string{"raw", "qcow2"} {
		out := filepath.Join(tmp, "shared."+f)
		export("077", "-O", f, "--mode", "0640", "v", out)
		if m := mode(out); m != 0o640 {
			t.Errorf("--mode 0640 -O %s: mode %04o", f, m)
		}
	}
	if out, code := exitCode(t, "volume", "export", "--data-dir", data, "--mode", "rw", "v", filepath.Join(tmp, "bad.raw")); code == 0 {
		t.Errorf("--mode rw accepted:\n%s", out)
	}
}
