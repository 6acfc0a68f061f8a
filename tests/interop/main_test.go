// Package interop tests vmsan's NBD server with real, independent NBD
// clients: qemu-io, qemu-img, nbdinfo, nbdcopy, fio's nbd engine and a QEMU
// guest whose virtio disk is a vmsan export.
//
// Run it with:
//
//	go test ./tests/interop/
//
// TestMain builds cmd/vmsan once; every test starts its own `vmsan serve` on
// an ephemeral port with its own data directory on a disk filesystem (tmpfs
// would hide O_DIRECT and hole-punching behaviour) and stops it in Cleanup.
//
// VMSAN_INTEROP_SERVER=nbdkit|qemu-nbd|nbd-server runs the same tests against
// an anchor server instead; that is how the harness itself is validated.
//
// When the CI environment variable is set, a missing external tool fails the
// test; locally it skips. The QEMU guest test needs scripts/guest/build.sh to
// have run (it runs it itself when the cache is missing).
//
// Tests run in parallel with each other (t.Parallel) but bounded by
// -parallel; every server process is owned by exactly one test.
package interop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

var (
	serverKind servers.Kind // server under test
	vmsanBin   string       // built binary (serverKind == VMSAN)
	repoRoot   string
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	serverKind = servers.VMSAN
	if s := os.Getenv("VMSAN_INTEROP_SERVER"); s != "" {
		k, err := servers.ParseKind(s)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		serverKind = k
	}
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	if serverKind == servers.VMSAN {
		dir, err := os.MkdirTemp("", "vmsan-interop-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer os.RemoveAll(dir)
		vmsanBin = filepath.Join(dir, "vmsan")
		cmd := exec.Command("go", "build", "-o", vmsanBin, "./cmd/vmsan")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "building vmsan: %v\n%s", err, out)
			return 1
		}
	}
	return m.Run()
}

// need checks that every tool is on PATH: fatal in CI, skip locally.
func need(t testing.TB, tools ...string) {
	t.Helper()
	var missing []string
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) == 0 {
		return
	}
	testutil.SkipOrFail(t, "missing tools: %s (make test installs them)", strings.Join(missing, ", "))
}

// needServer checks the tools the server under test needs.
func needServer(t testing.TB) {
	t.Helper()
	if serverKind != servers.VMSAN {
		need(t, serverKind.Executable())
	}
}

const tmpfsMagic = 0x01021994

// diskDir returns a fresh directory on a disk filesystem: t.TempDir() unless
// that is tmpfs, in which case a directory under <repo>/.cache/interop.
func diskDir(t testing.TB) string {
	t.Helper()
	d := t.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(d, &st); err != nil {
		t.Fatalf("statfs %s: %v", d, err)
	}
	if st.Type != tmpfsMagic {
		return d
	}
	base := filepath.Join(repoRoot, ".cache", "interop")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(repoRoot, ".cache", ".gitignore"), []byte("*\n"), 0o644)
	d, err := os.MkdirTemp(base, "t-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// target is one export of the server under test, with its server process.
type target struct {
	t        testing.TB
	dir      string // vmsan data dir, or the directory holding the anchor's file
	file     string // anchors: the raw file served
	name     string
	size     int64
	readOnly bool
	extra    []string // extra server arguments
	tlsDir   string   // servers.Options.TLSDir
	srv      *servers.Server
}

type targetOpt func(*target)

func readOnly() targetOpt { return func(tg *target) { tg.readOnly = true } }

// withTLS makes the server require TLS with the certificates in dir (see
// servers.Options.TLSDir).
func withTLS(dir string) targetOpt { return func(tg *target) { tg.tlsDir = dir } }

// serverArgs appends arguments to the server's command line.
func serverArgs(args ...string) targetOpt {
	return func(tg *target) { tg.extra = append(tg.extra, args...) }
}

// newTarget creates a volume of size bytes and starts a server exporting it.
// The server is stopped in t.Cleanup; for vmsan a non-zero exit on SIGTERM
// fails the test (graceful shutdown is part of the contract).
func newTarget(t testing.TB, size int64, opts ...targetOpt) *target {
	t.Helper()
	needServer(t)
	tg := &target{t: t, dir: diskDir(t), name: "vol", size: size}
	for _, o := range opts {
		o(tg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if serverKind == servers.VMSAN {
		var extra []string
		if tg.readOnly {
			extra = append(extra, "--read-only")
		}
		if err := servers.CreateVMSANVolume(ctx, vmsanBin, tg.dir, tg.name, size, extra...); err != nil {
			t.Fatal(err)
		}
	} else {
		tg.file = filepath.Join(tg.dir, tg.name+".raw")
		f, err := os.Create(tg.file)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	tg.start()
	t.Cleanup(func() {
		if tg.srv == nil {
			return
		}
		if err := tg.srv.Stop(); err != nil {
			t.Errorf("stopping %s: %v\n%s", serverKind, err, tg.srv.LogTail(4000))
		}
	})
	return tg
}

func (tg *target) start() {
	tg.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := servers.Start(ctx, serverKind, servers.Options{
		File: tg.file, Export: tg.name, ReadOnly: tg.readOnly,
		Binary: vmsanBin, DataDir: tg.dir, LogDir: tg.t.TempDir(), ExtraArgs: tg.extra, TLSDir: tg.tlsDir,
	})
	if err != nil {
		tg.t.Fatal(err)
	}
	tg.srv = s
}

// uri of the export (changes on restart: a new port is picked).
func (tg *target) uri() string { return tg.srv.URI }

// restart stops the server gracefully (SIGTERM: drain, flush, exit 0) and
// starts it again on the same data.
func (tg *target) restart() {
	tg.t.Helper()
	err := tg.srv.Stop()
	if err != nil {
		tg.t.Fatalf("graceful stop of %s: %v\n%s", serverKind, err, tg.srv.LogTail(4000))
	}
	tg.srv = nil
	tg.start()
}

// cmdResult is the outcome of an external command.
type cmdResult struct {
	code   int // exit status; -1 if it did not run or was killed
	stdout string
	stderr string
}

// runCmd runs name with args under a timeout and returns its result; it fails
// the test only if the command could not be started or timed out.
func runCmd(t testing.TB, timeout time.Duration, name string, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	r := cmdResult{stdout: so.String(), stderr: se.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		t.Fatalf("%s %s: timed out after %v\nstdout: %s\nstderr: %s", name, strings.Join(args, " "), timeout, tail(r.stdout), tail(r.stderr))
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// mustRun runs a command that must exit 0 and returns its stdout.
func mustRun(t testing.TB, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	r := runCmd(t, timeout, name, args...)
	if r.code != 0 {
		t.Fatalf("%s %s: exit %d\nstdout: %s\nstderr: %s", name, strings.Join(args, " "), r.code, tail(r.stdout), tail(r.stderr))
	}
	return r.stdout
}

func tail(s string) string {
	const n = 3000
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

const (
	KiB = int64(1) << 10
	MiB = int64(1) << 20
	GiB = int64(1) << 30
)
