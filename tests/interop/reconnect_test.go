package interop

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// TestQEMUReconnectDelay: QEMU's NBD client with reconnect-delay survives
// a vmsan kill -9 and restart (docs/iscsi.md "NBD: surviving a daemon
// restart"). One qemu-io process keeps its NBD
// connection; the daemon is killed, a write is issued while it is down,
// the daemon restarts on the same address: the write completes once QEMU
// has reconnected, and everything written before and after reads back.
// Without reconnect-delay the write fails at once (checked too, so the
// test shows what the option buys).
func TestQEMUReconnectDelay(t *testing.T) {
	if serverKind != servers.VMSAN {
		t.Skip("vmsan-specific (restarts a vmsan serve)") // skip: variant
	}
	testutil.NeedTool(t, "qemu-io")
	for _, delay := range []int{15, 0} {
		t.Run(fmt.Sprintf("reconnect-delay=%d", delay), func(t *testing.T) {
			reconnectRun(t, delay)
		})
	}
}

func reconnectRun(t *testing.T, delay int) {
	dir := testutil.DiskTempDir(t)
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cf := filepath.Join(dir, "vmsan.yaml")
	cfg := fmt.Sprintf("data_dir: %s\nlisten: [%q]\nno_default_volume: true\nvolumes:\n  - {name: disk, size: 16M}\n",
		filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(cf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "vmsan.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	start := func() *exec.Cmd {
		cmd := exec.Command(vmsanBin, "serve", "--config", cf)
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
				return cmd
			}
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("vmsan did not listen on %s", addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	srv := start()
	t.Cleanup(func() {
		srv.Process.Signal(os.Interrupt)
		srv.Wait()
	})

	opts := fmt.Sprintf("driver=raw,file.driver=nbd,file.server.type=inet,file.server.host=127.0.0.1,file.server.port=%d,file.export=disk", port)
	if delay > 0 {
		opts += fmt.Sprintf(",file.reconnect-delay=%d", delay)
	}
	q := exec.Command(testutil.NeedTool(t, "qemu-io"), "--image-opts", opts)
	in, err := q.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, err := q.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	q.Stderr = q.Stdout
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var out strings.Builder
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			mu.Lock()
			out.WriteString(sc.Text() + "\n")
			mu.Unlock()
			lines <- sc.Text()
		}
		close(lines)
	}()
	// waitLine waits for a line containing s (qemu-io prints "wrote N/N
	// bytes" / "read N/N bytes" per command, errors otherwise).
	waitLine := func(d time.Duration, s ...string) (string, bool) {
		timeout := time.After(d)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return "", false
				}
				for _, x := range s {
					if strings.Contains(l, x) {
						return l, true
					}
				}
			case <-timeout:
				return "", false
			}
		}
	}
	send := func(c string) { io.WriteString(in, c+"\n") }
	defer func() {
		in.Close()
		done := make(chan struct{})
		go func() { q.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			q.Process.Kill()
			<-done
		}
	}()

	send("write -P 0x11 0 64k")
	if l, ok := waitLine(30*time.Second, "wrote", "error", "failed"); !ok || !strings.Contains(l, "wrote") {
		t.Fatalf("first write: %q", l)
	}
	srv.Process.Signal(syscall.SIGKILL)
	srv.Wait()
	killed := time.Now()
	send("write -P 0x22 64k 64k") // issued while the daemon is down
	time.Sleep(time.Second)
	srv = start()
	l, ok := waitLine(time.Duration(delay+30)*time.Second, "wrote", "error", "failed")
	if delay == 0 {
		if ok && strings.Contains(l, "wrote") {
			t.Fatalf("without reconnect-delay a write issued while the server was down succeeded: %q", l)
		}
		return
	}
	if !ok || !strings.Contains(l, "wrote") {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("write across the restart: %q\n%s", l, out.String())
	}
	t.Logf("write issued during the outage completed %.2fs after the kill (restart after 1s)", time.Since(killed).Seconds())
	// One command at a time: qemu-io does not read ahead on a pipe.
	for i, c := range []string{"read -P 0x11 0 64k", "read -P 0x22 64k 64k"} {
		send(c)
		if l, ok := waitLine(30*time.Second, "read 65536/65536", "error", "failed", "Pattern"); !ok || !strings.Contains(l, "read 65536/65536") {
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("read back %d: %q\n%s", i, l, out.String())
		}
	}
	send("quit")
}
