// Package repl_test runs two real `vmsan serve` processes replicating a
// volume through a fault-injecting proxy, drives them with real NBD clients
// (qemu-io, fio) and checks convergence, failover and split brain.
package repl_test

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/testutil/faultproxy"
)

var vmsanBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "vmsan-repl-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	vmsanBin = filepath.Join(dir, "vmsan")
	cmd := exec.Command("go", "build", "-o", vmsanBin, "github.com/vmsan/vmsan/cmd/vmsan")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building vmsan: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		testutil.NeedTool(t, tool)
	}
}

// Ports for the servers come from 25000-25999, below the kernel's
// ephemeral range (32768+): a port picked with ":0" and released can be
// taken by any outgoing connection on the machine before the server binds
// it ("address already in use" seen on a busy CI host). Within the range
// a counter never hands out the same port twice in one test binary.
const portLo, portHi = 25000, 26000

var nextPort = portLo + os.Getpid()%(portHi-portLo)

func freeAddr(t *testing.T) string {
	t.Helper()
	for range portHi - portLo {
		port := nextPort
		nextPort++
		if nextPort >= portHi {
			nextPort = portLo
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr
		}
	}
	t.Fatal("no free port in 25000-25999")
	return ""
}

const volName = "vm1"

// node is one vmsan serve process.
type node struct {
	t        *testing.T
	name     string
	dir      string
	nbd      string
	replAddr string
	config   string // if set, started with --config
	nofile   int    // if set, RLIMIT_NOFILE (soft and hard) through prlimit(1)
	cmd      *exec.Cmd
	exited   chan struct{}
}

func (n *node) run(args ...string) string {
	n.t.Helper()
	out, err := exec.Command(vmsanBin, append(args, "--data-dir", n.dir)...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("vmsan %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func (n *node) start() {
	n.t.Helper()
	logf, err := os.OpenFile(filepath.Join(n.dir, "serve.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	args := []string{"serve", "--data-dir", n.dir, "--listen", n.nbd}
	if n.config != "" {
		args = append(args, "--config", n.config)
	}
	n.cmd = exec.Command(vmsanBin, args...)
	if n.nofile > 0 {
		pl := testutil.NeedTool(n.t, "prlimit")
		n.cmd = exec.Command(pl, append([]string{fmt.Sprintf("--nofile=%d:%d", n.nofile, n.nofile), "--", vmsanBin}, args...)...)
	}
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.exited = make(chan struct{})
	go func() { n.cmd.Wait(); logf.Close(); close(n.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("tcp", n.nbd); err == nil {
			c.Close()
			// The control socket comes up right after the NBD listener.
			if dc, err := daemon.Dial(n.dir); err == nil {
				_, err = dc.Status()
				dc.Close()
				if err == nil {
					return
				}
			}
		}
		select {
		case <-n.exited:
			b, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
			n.t.Fatalf("%s: vmsan serve exited:\n%s", n.name, b)
		default:
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("%s: vmsan serve did not start", n.name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *node) kill9() {
	n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
}

func (n *node) stop() {
	if n.cmd == nil {
		return
	}
	select {
	case <-n.exited:
		return
	default:
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		n.kill9()
	}
}

func (n *node) status() driver.Status {
	n.t.Helper()
	c, err := daemon.Dial(n.dir)
	if err != nil {
		n.t.Fatalf("%s: %v", n.name, err)
	}
	defer c.Close()
	var st []driver.Status
	if err := c.Do("GET", "/v1/repl", nil, &st); err != nil || len(st) != 1 {
		n.t.Fatalf("%s: repl status: %v %v", n.name, st, err)
	}
	return st[0]
}

func (n *node) engine() daemon.EngineStats {
	n.t.Helper()
	c, err := daemon.Dial(n.dir)
	if err != nil {
		n.t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status()
	if err != nil {
		n.t.Fatal(err)
	}
	for _, v := range st.Volumes {
		if v.Name == volName && v.Engine != nil {
			return *v.Engine
		}
	}
	n.t.Fatal("no engine stats")
	return daemon.EngineStats{}
}

func (n *node) admin(op string) error {
	c, err := daemon.Dial(n.dir)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Do("POST", "/v1/repl/"+volName+"/"+op, nil, nil)
}

func (n *node) uri() string { return "nbd://" + n.nbd + "/" + volName }

func (n *node) rawSum() [32]byte {
	n.t.Helper()
	b, err := os.ReadFile(filepath.Join(n.dir, "volumes", volName+".raw"))
	if err != nil {
		n.t.Fatal(err)
	}
	return sha256.Sum256(b)
}

type pairT struct {
	a, b *node
	px   *faultproxy.Proxy
}

type pairOpts struct {
	size       string
	protocol   string
	splitBrain string
	extra      []string // more `repl configure` flags for both (later flags win)
	nofileA    int      // a's RLIMIT_NOFILE (0: inherited)
	nofileB    int      // b's RLIMIT_NOFILE (0: inherited)
}

// newPair: a is primary and dials b through the fault proxy; b accepts.
func newPair(t *testing.T, o pairOpts) *pairT {
	t.Helper()
	need(t, "qemu-io")
	if o.size == "" {
		o.size = "64M"
	}
	base := t.TempDir()
	p := &pairT{}
	p.a = &node{t: t, name: "a", dir: filepath.Join(base, "a"), nbd: freeAddr(t), replAddr: freeAddr(t), nofile: o.nofileA}
	p.b = &node{t: t, name: "b", dir: filepath.Join(base, "b"), nbd: freeAddr(t), replAddr: freeAddr(t), nofile: o.nofileB}
	var err error
	p.px, err = faultproxy.New("127.0.0.1:0", p.b.replAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.px.Close() })
	common := []string{"--tick-ms", "20", "--ping-interval", "5", "--ping-timeout", "25", "--ko-ticks", "500", "--al-retire-ticks", "25",
		"--shared-secret-file", secretFile(t, base, pairSecret)}
	if o.protocol != "" {
		common = append(common, "--protocol", o.protocol)
	}
	if o.splitBrain != "" {
		common = append(common, "--split-brain", o.splitBrain)
	}
	common = append(common, o.extra...)
	for _, n := range []*node{p.a, p.b} {
		os.MkdirAll(n.dir, 0o755)
		n.run("volume", "create", volName, "--size", o.size)
	}
	p.a.run(append([]string{"repl", "configure", volName, "--listen", p.a.replAddr, "--peer", p.px.Addr(), "--dial", "yes", "--role", "primary"}, common...)...)
	p.b.run(append([]string{"repl", "configure", volName, "--listen", p.b.replAddr, "--peer", p.a.replAddr, "--dial", "no", "--role", "secondary"}, common...)...)
	p.a.start()
	p.b.start()
	t.Cleanup(func() {
		p.a.stop()
		p.b.stop()
		if t.Failed() {
			for _, n := range []*node{p.a, p.b} {
				b, _ := os.ReadFile(filepath.Join(n.dir, "serve.log"))
				t.Logf("%s serve.log (tail):\n%s", n.name, tail(string(b), 30))
			}
		}
	})
	p.waitSynced(t, 30*time.Second)
	return p
}

// pairSecret is the shared secret of the test pairs.
const pairSecret = "tests-repl-shared-secret-0123456789"

// secretFile writes secret to a file in dir (mode 0600) and returns its
// path, for --shared-secret-file or shared_secret_file.
func secretFile(t *testing.T, dir, secret string) string {
	t.Helper()
	os.MkdirAll(dir, 0o700)
	f, err := os.CreateTemp(dir, "repl-*.secret")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(secret + "\n"); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

func tail(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// waitSynced waits until both sides are Connected and nothing is out of sync.
func (p *pairT) waitSynced(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		sa, sb := p.a.status(), p.b.status()
		if sa.Conn == "Connected" && sb.Conn == "Connected" && sa.OutOfSync == 0 && sb.OutOfSync == 0 &&
			sa.Disk == "UpToDate" && sb.Disk == "UpToDate" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not in sync after %v:\n a=%+v\n b=%+v", d, sa, sb)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitUntil(t *testing.T, what string, d time.Duration, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// qemuIO runs qemu-io commands against uri and returns the offsets of the
// writes it reported complete (acknowledged), even if it then failed.
func qemuIO(t *testing.T, uri string, cmds ...string) (acked []string, err error) {
	t.Helper()
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	args = append(args, uri)
	out, err := exec.Command("qemu-io", args...).CombinedOutput()
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "wrote ") {
			acked = append(acked, l)
		}
	}
	if err == nil && strings.Contains(string(out), "failed") {
		err = fmt.Errorf("qemu-io: %s", tail(string(out), 5))
	}
	if err != nil {
		err = fmt.Errorf("%w: %s", err, tail(string(out), 5))
	}
	return acked, err
}

// mustIO runs qemu-io and fails the test on any error.
func mustIO(t *testing.T, uri string, cmds ...string) {
	t.Helper()
	if _, err := qemuIO(t, uri, cmds...); err != nil {
		t.Fatal(err)
	}
}

// qemuIOWatch runs qemu-io like qemuIO and calls onAck(n) after the n-th
// acknowledged write, as it happens (so a test can kill a node exactly
// mid-workload, whatever the machine's speed).
func qemuIOWatch(t *testing.T, uri string, onAck func(n int), cmds ...string) (acked []string, err error) {
	t.Helper()
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	args = append(args, uri)
	// qemu-io's stdout is block-buffered into a pipe: without line
	// buffering the acknowledgements would only show up in 4 KiB bursts.
	cmd := exec.Command("qemu-io", args...)
	if sb, err := exec.LookPath("stdbuf"); err == nil {
		cmd = exec.Command(sb, append([]string{"-oL", "qemu-io"}, args...)...)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(out)
	var all []string
	for sc.Scan() {
		l := sc.Text()
		all = append(all, l)
		if strings.HasPrefix(l, "wrote ") {
			acked = append(acked, l)
			onAck(len(acked))
		}
	}
	err = cmd.Wait()
	if err == nil && strings.Contains(strings.Join(all, "\n"), "failed") {
		err = fmt.Errorf("qemu-io: %s", tail(strings.Join(all, "\n"), 5))
	}
	return acked, err
}
