package iscsi

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// Replication added at runtime (`vmsan repl configure` on two running
// daemons) under an iSCSI session that keeps writing: the session is never
// dropped and no write fails while the volume's replica starts (its I/O is
// held meanwhile), and the pair ends byte-equal.
func TestReplicationAddedUnderISCSISession(t *testing.T) {
	qemuIO := testutil.NeedTool(t, "qemu-io")
	base := testutil.DiskTempDir(t)
	a := &pairNode{dir: filepath.Join(base, "a"), iscsi: freeLoop(t), nbd: freeLoop(t), repl: freeLoop(t)}
	b := &pairNode{dir: filepath.Join(base, "b"), iscsi: freeLoop(t), nbd: freeLoop(t), repl: freeLoop(t)}
	for _, n := range []*pairNode{a, b} {
		n.data = filepath.Join(n.dir, "data")
		n.cfg = fmt.Sprintf(`data_dir: %s
listen: [%q]
no_default_volume: true
volumes:
  - name: disk
    size: %d
iscsi:
    mode: per-volume
    node_name: test
    allow_any: true
    listen: [{addr: %q, tpgt: 1, relative_port: 1}]
    targets: [{volume: disk, scsi_id: %s}]
`, n.data, n.nbd, volSize, n.iscsi, pairSCSIID)
		n.start(t)
	}
	secret := filepath.Join(base, "repl.secret")
	if err := os.WriteFile(secret, []byte("iscsi-runtime-repl-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// One session: 300 writes of 64 KiB, 20 ms apart (6 s at least, so
	// the two configure runs fall inside it even on a loaded machine),
	// each then read back.
	const writes = 300
	var cmds []string
	for i := 0; i < writes; i++ {
		off := int64(i%64) * 65536
		cmds = append(cmds, "-c", fmt.Sprintf("write -P 0x%02x %d 64k", i%200+1, off), "-c", fmt.Sprintf("read -P 0x%02x %d 64k", i%200+1, off), "-c", "sleep 20")
	}
	done, writing := make(chan struct{}), make(chan struct{})
	var lines []string
	var ioErr error
	args := append(append([]string{"-f", "raw"}, cmds...), a.url())
	// qemu-io's stdout is block-buffered into a pipe: line buffering
	// shows the first write as it is acknowledged, so the change below
	// happens inside the session.
	cmd := exec.Command(testutil.NeedTool(t, "stdbuf"), append([]string{"-oL", qemuIO}, args...)...)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if len(lines) == 1 {
				close(writing) // the first write's answer (or an error, checked below)
			}
		}
		ioErr = cmd.Wait()
	}()
	select {
	case <-writing: // the session is up and writing
	case <-time.After(60 * time.Second):
		t.Fatal("the iSCSI session did not start writing")
	}
	common := []string{"--tick-ms", "20", "--ping-interval", "5", "--ping-timeout", "50", "--shared-secret-file", secret}
	for _, c := range []struct {
		n, peer    *pairNode
		role, dial string
	}{{b, a, "secondary", "no"}, {a, b, "primary", "yes"}} {
		args := append([]string{"repl", "configure", "disk", "--data-dir", c.n.data, "--listen", c.n.repl, "--peer", c.peer.repl, "--role", c.role, "--dial", c.dial}, common...)
		if o, err := run(t, 60*time.Second, vmsanBin, args...); err != nil || !strings.Contains(o, "applied now") {
			t.Fatalf("repl configure: %v\n%s", err, o)
		}
	}
	select {
	case <-done:
		t.Fatal("the iSCSI session ended before replication was added: nothing was tested (make it longer)")
	default:
	}
	waitCond(t, "replication connected", 60*time.Second, func() bool {
		ra, ca := a.replStatus(t)
		rb, cb := b.replStatus(t)
		return ra == "Primary" && rb == "Secondary" && ca == "Connected" && cb == "Connected"
	}, func() string { return a.p.logTail() + "\n---\n" + b.p.logTail() })
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the iSCSI session's I/O did not finish")
	}
	s := strings.Join(lines, "\n")
	if ioErr != nil || strings.Contains(s, "error") || strings.Contains(s, "fail") || strings.Contains(s, "Pattern verification") || strings.Count(s, "wrote ") != writes {
		t.Fatalf("the iSCSI session saw errors (or lost writes) while replication was added: %v, %d writes acknowledged\n%s", ioErr, strings.Count(s, "wrote "), tailLines(s, 15))
	}
	sum := func(n *pairNode) [32]byte {
		raw, err := os.ReadFile(filepath.Join(n.data, "volumes", "disk.raw"))
		if err != nil {
			t.Fatal(err)
		}
		return sha256.Sum256(raw)
	}
	waitCond(t, "replicas byte-equal", 60*time.Second, func() bool { return sum(a) == sum(b) })
}

func tailLines(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
