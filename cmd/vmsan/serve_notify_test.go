package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/testutil"
)

// TestServeSdNotify runs the real binary the way a Type=notify unit does:
// NOTIFY_SOCKET set (an abstract name, as systemd uses for some managers).
// READY=1 must arrive, and once it has, an NBD client must get through;
// SIGHUP must be framed by RELOADING=1 and READY=1; SIGTERM must produce
// STOPPING=1 and a clean exit.
func TestServeSdNotify(t *testing.T) {
	bin, cleanup, err := testutil.BuildVmsan()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	addr := fmt.Sprintf("@vmsan-serve-notify-%d-%d", os.Getpid(), time.Now().UnixNano())
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	recv := func() string {
		t.Helper()
		ln.SetReadDeadline(time.Now().Add(60 * time.Second))
		b := make([]byte, 4096)
		n, err := ln.Read(b)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return string(b[:n])
	}

	dir := t.TempDir()
	sock := filepath.Join(dir, "nbd.sock")
	cmd := exec.Command(bin, "serve", "--data-dir", dir, "--listen", "unix:"+sock)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+addr)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	}()

	if got := recv(); !strings.HasPrefix(got, "READY=1\n") && got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	// READY=1 promises the listener is bound: no retry loop here.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "nbd+unix:///default?socket="+sock, nil)
	if err != nil {
		t.Fatalf("NBD connect right after READY=1: %v\n%s", err, out.String())
	}
	buf := make([]byte, 4096)
	if _, err := c.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	c.Close()

	// SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1 once applied
	// (what systemd's Type=notify-reload waits for; 252 ignores them).
	cmd.Process.Signal(syscall.SIGHUP)
	if got := recv(); !strings.HasPrefix(got, "RELOADING=1\nMONOTONIC_USEC=") {
		t.Fatalf("after SIGHUP got %q, want RELOADING=1 with MONOTONIC_USEC", got)
	}
	if got := recv(); !strings.HasPrefix(got, "READY=1") {
		t.Fatalf("after the reload got %q, want READY=1", got)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	if got := recv(); !strings.HasPrefix(got, "STOPPING=1") {
		t.Fatalf("after SIGTERM got %q, want STOPPING=1", got)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("exit: %v\n%s", waitErr, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not exit after SIGTERM\n%s", out.String())
	}
}

// TestVersionCommand: `vmsan version` names the version and the Go
// toolchain (the -X override path is covered by the packaging test, which
// builds through the Makefile).
func TestVersionCommand(t *testing.T) {
	old := os.Stdout
	r, w, _ := os.Pipe()
	os.Stdout = w
	rootCmd := newRootCmd()
	rootCmd.SetArgs([]string{"version"})
	err := rootCmd.Execute()
	w.Close()
	os.Stdout = old
	var b bytes.Buffer
	b.ReadFrom(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(b.String(), "vmsan ") || !strings.Contains(b.String(), "\ngo: go1.") {
		t.Fatalf("vmsan version printed:\n%s", b.String())
	}
}
