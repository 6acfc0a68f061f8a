package volume

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func mode(t *testing.T, p string) os.FileMode {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// TestPermissionsUnderUmask000: with the most permissive umask, everything
// the store creates is owner-only (volumes are VM disks). Before the fix,
// raw files were 0666&^umask and directories 0777&^umask.
func TestPermissionsUnderUmask000(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "data")
	s := openStore(t, dir)
	if _, err := s.Create(CreateOptions{Name: "vm1", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	sd, err := s.StateDir("vm1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resize("vm1", 2<<20, false); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		dir:                              0o700,
		filepath.Join(dir, VolumesDir):   0o700,
		filepath.Join(dir, LockFileName): 0o600,
		s.RawPath("vm1"):                 0o600,
		s.metaPath("vm1"):                0o600,
		sd:                               0o700,
	} {
		if got := mode(t, p); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
	}
	for _, n := range s.Notices() {
		t.Errorf("notice on a fresh directory: %+v", n)
	}
}

// TestPermissionsTightenedAtOpen: files and directories from before (or
// made by hand) with group/other access are tightened by Open, with a
// notice for the log.
func TestPermissionsTightenedAtOpen(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if _, err := s.Create(CreateOptions{Name: "vm1", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	sd, _ := s.StateDir("vm1")
	s.Close()
	repl := filepath.Join(dir, "repl", "vm1")
	os.MkdirAll(repl, 0o755)
	os.WriteFile(filepath.Join(repl, "meta.json"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(sd, "x"), nil, 0o664)
	for _, p := range []string{dir, filepath.Join(dir, VolumesDir), sd, filepath.Join(dir, "repl"), repl} {
		os.Chmod(p, 0o755)
	}
	for _, p := range []string{s.RawPath("vm1"), s.metaPath("vm1"), filepath.Join(repl, "meta.json"), filepath.Join(dir, LockFileName)} {
		os.Chmod(p, 0o644)
	}
	// A socket in the data directory is not the store's to change.
	sock := filepath.Join(dir, "test.sock")
	fd, _ := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	syscall.Bind(fd, &syscall.SockaddrUnix{Name: sock})
	defer syscall.Close(fd)
	os.Chmod(sock, 0o666)

	s = openStore(t, dir)
	for _, p := range []string{dir, filepath.Join(dir, VolumesDir), sd, filepath.Join(dir, "repl"), repl} {
		if got := mode(t, p); got != 0o700 {
			t.Errorf("%s: %v after Open", p, got)
		}
	}
	for _, p := range []string{s.RawPath("vm1"), s.metaPath("vm1"), filepath.Join(repl, "meta.json"), filepath.Join(dir, LockFileName)} {
		if got := mode(t, p); got != 0o600 {
			t.Errorf("%s: %v after Open", p, got)
		}
	}
	if got := mode(t, filepath.Join(sd, "x")); got != 0o600 {
		t.Errorf("state file: %v", got)
	}
	if got := mode(t, sock); got != 0o666 {
		t.Errorf("socket changed to %v", got)
	}
	var msgs []string
	for _, n := range s.Notices() {
		msgs = append(msgs, n.Msg)
	}
	if all := strings.Join(msgs, "\n"); !strings.Contains(all, s.RawPath("vm1")+" from -rw-r--r-- to -rw-------") {
		t.Errorf("no notice for the raw file:\n%s", all)
	}
}

// TestSharedStickyDataDirLeftAlone: --data-dir on a sticky shared
// directory (like /tmp) must not make it private; volumes/ is.
func TestSharedStickyDataDirLeftAlone(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, os.ModeSticky|0o777)
	s := openStore(t, dir)
	if got, _ := os.Lstat(dir); got.Mode()&os.ModeSticky == 0 || got.Mode().Perm() != 0o777 {
		t.Fatalf("sticky directory changed: %v", got.Mode())
	}
	if got := mode(t, filepath.Join(dir, VolumesDir)); got != 0o700 {
		t.Fatalf("volumes/: %v", got)
	}
	s.Close()
}

// TestLockSurvivesLockFileRemoval: the lock is on the directory itself, so
// removing vmsan.lock does not let a second owner in; from another process
// either. Before the fix, removing the file let a second Open succeed.
func TestLockSurvivesLockFileRemoval(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if err := os.Remove(filepath.Join(dir, LockFileName)); err != nil {
		t.Fatal(err)
	}
	if s2, err := Open(dir); !errors.Is(err, ErrLocked) {
		if err == nil {
			s2.Close()
		}
		t.Fatalf("second Open after removing the lock file: %v", err)
	}
	// Another process (this test binary, re-executed).
	out, err := helperOpen(t, dir)
	if err == nil || !strings.Contains(out, "in use by another vmsan process") {
		t.Fatalf("second process opened the directory: %v\n%s", err, out)
	}
	s.Close()
	if out, err := helperOpen(t, dir); err != nil {
		t.Fatalf("after Close, another process cannot open: %v\n%s", err, out)
	}
}

func helperOpen(t *testing.T, dir string) (string, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "VMSAN_HELPER_OPEN="+dir)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestMain doubles as the second process of TestLockSurvivesLockFileRemoval.
func TestMain(m *testing.M) {
	if dir := os.Getenv("VMSAN_HELPER_OPEN"); dir != "" {
		s, err := Open(dir)
		if err != nil {
			fmt.Println(err)
			os.Exit(3)
		}
		s.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}
