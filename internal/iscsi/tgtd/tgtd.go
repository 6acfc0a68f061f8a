// Package tgtd runs tgt's iSCSI target daemon (Debian package tgt: tgtd and
// tgtadm) as a reference target that vmsan did not write: tests check the
// in-repo initiator against it, and bench/iscsi-compare compares vmsan's
// target with it on the same file.
//
// Simplest use:
//
//	srv, err := tgtd.Start(ctx, tgtd.Options{Files: []string{"/path/disk.img"}})
//	defer srv.Stop()
//	// iscsi://srv.Addr/srv.IQN/1 ; srv.LUNStats() reads tgt's counters
//
// tgtd needs root (its management lock file lives under /var/run/tgtd).
// Every Server gets its own iSCSI port and its own management control port
// (tgtd -C), so parallel tests and programs do not meet. tgtd runs in the
// foreground in its own process group and dies with its parent (PDEATHSIG).
//
// Concurrency: a Server's methods are safe for concurrent use.
package tgtd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultIQN is the target name Start creates when Options.IQN is empty.
const DefaultIQN = "iqn.2026-11.org.vmsan.test:tgt"

// Options describe the target to start.
type Options struct {
	// Files are exported as LUNs 1, 2, ... (LUN 0 is tgt's controller).
	Files []string
	// BSType is tgt's backing store: "rdwr" (pread/pwrite in a thread
	// pool, the default) or "aio" (Linux native AIO).
	BSType string
	// IQN of the target; DefaultIQN when empty.
	IQN string
	// User and Secret, when set, require one-way CHAP (an incoming
	// account); TargetUser and TargetSecret add mutual CHAP (an outgoing
	// account).
	User, Secret             string
	TargetUser, TargetSecret string
	// LUParams are logical unit parameters (tgtadm --mode logicalunit
	// --op update --params), e.g. "thin_provisioning=1" for UNMAP.
	LUParams string
	// Params are target parameters set with tgtadm --op update
	// (MaxRecvDataSegmentLength, FirstBurstLength, ...).
	Params map[string]string
	// Port is the iSCSI port on 127.0.0.1; 0 picks a free one.
	Port int
	// Log receives tgtd's output; nil discards it.
	Log *os.File
}

// Server is a running tgtd.
type Server struct {
	Addr string // 127.0.0.1:port
	IQN  string
	ctl  int
	cmd  *exec.Cmd
	done chan struct{}
	werr error
	once sync.Once
	out  *bytes.Buffer
	mu   sync.Mutex
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start launches tgtd and configures the target. A lost port race (tgtd
// exits at start-up) is retried with other ports.
func Start(ctx context.Context, o Options) (*Server, error) {
	var last error
	for i := 0; i < 4; i++ {
		s, err := start(ctx, o)
		if err == nil {
			return s, nil
		}
		last = err
		if !errors.Is(err, errExited) || o.Port != 0 {
			break
		}
	}
	return nil, last
}

var errExited = errors.New("tgtd exited during start-up")

type lockedBuf struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.b.Len() < 1<<20 {
		w.b.Write(p)
	}
	return len(p), nil
}

func start(ctx context.Context, o Options) (*Server, error) {
	port := o.Port
	if port == 0 {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		port = p
	}
	s := &Server{
		Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		IQN:  o.IQN,
		// The control port names an abstract socket, not a TCP port; any
		// number unlikely to be taken by another tgtd on this machine.
		ctl:  1024 + mrand.IntN(31000), // tgtd takes 0..32767
		done: make(chan struct{}),
		out:  new(bytes.Buffer),
	}
	if s.IQN == "" {
		s.IQN = DefaultIQN
	}
	s.cmd = exec.Command("tgtd", "-f", "-C", strconv.Itoa(s.ctl), "--iscsi", "portal="+s.Addr)
	w := lockedBuf{&s.mu, s.out}
	if o.Log != nil {
		s.cmd.Stdout, s.cmd.Stderr = o.Log, o.Log
	} else {
		s.cmd.Stdout, s.cmd.Stderr = w, w
	}
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start tgtd: %w", err)
	}
	go func() {
		s.werr = s.cmd.Wait()
		close(s.done)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.configure(o); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("%w: %v: %s", errExited, s.werr, s.Output())
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			if _, err = s.Adm("--mode", "target", "--op", "show"); err == nil {
				// Our tgtd, not another process on the port: it is alive
				// and answers on our control port.
				select {
				case <-s.done:
					continue
				case <-time.After(50 * time.Millisecond):
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tgtd did not listen on %s: %v: %s", s.Addr, err, s.Output())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Adm runs tgtadm on this server's control port with --lld iscsi.
func (s *Server) Adm(args ...string) (string, error) {
	a := append([]string{"-C", strconv.Itoa(s.ctl), "--lld", "iscsi"}, args...)
	out, err := exec.Command("tgtadm", a...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("tgtadm %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (s *Server) configure(o Options) error {
	bs := o.BSType
	if bs == "" {
		bs = "rdwr"
	}
	steps := [][]string{{"--mode", "target", "--op", "new", "--tid", "1", "-T", s.IQN}}
	for i, f := range o.Files {
		steps = append(steps, []string{"--mode", "logicalunit", "--op", "new", "--tid", "1", "--lun", strconv.Itoa(i + 1), "-b", f, "--bstype", bs})
		if o.LUParams != "" {
			steps = append(steps, []string{"--mode", "logicalunit", "--op", "update", "--tid", "1", "--lun", strconv.Itoa(i + 1), "--params", o.LUParams})
		}
	}
	for k, v := range o.Params {
		steps = append(steps, []string{"--mode", "target", "--op", "update", "--tid", "1", "--name", k, "--value", v})
	}
	if o.User != "" {
		steps = append(steps,
			[]string{"--mode", "account", "--op", "new", "--user", o.User, "--password", o.Secret},
			[]string{"--mode", "account", "--op", "bind", "--tid", "1", "--user", o.User})
	}
	if o.TargetUser != "" {
		steps = append(steps,
			[]string{"--mode", "account", "--op", "new", "--user", o.TargetUser, "--password", o.TargetSecret},
			[]string{"--mode", "account", "--op", "bind", "--tid", "1", "--user", o.TargetUser, "--outgoing"})
	}
	steps = append(steps, []string{"--mode", "target", "--op", "bind", "--tid", "1", "-I", "ALL"})
	for _, st := range steps {
		if _, err := s.Adm(st...); err != nil {
			return err
		}
	}
	return nil
}

// Pid is tgtd's process id (for CPU accounting).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Output returns what tgtd printed (when Options.Log was nil).
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// Stop kills tgtd and waits for it.
func (s *Server) Stop() {
	s.once.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
		}
	})
}

// LUNStats are tgt's per-LUN, per-session counters (tgtadm --op stat):
// the bytes of completed reads and writes as the target counted them.
type LUNStats struct {
	LUN, Session          int
	ReadBytes, ReadCmds   uint64
	WriteBytes, WriteCmds uint64
	Errors                uint64
}

// Stats returns tgt's counters for every LUN and session of the target.
// tgt keeps them per session: read them before the session logs out.
func (s *Server) Stats() ([]LUNStats, error) {
	out, err := s.Adm("--mode", "target", "--op", "stat", "--tid", "1")
	if err != nil {
		return nil, err
	}
	var st []LUNStats
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// tgt lun sid rd_subm(bytes,cmds) rd_done(bytes,cmds) wr_subm wr_done errs
		if len(f) != 12 || f[0] == "tgt" {
			continue
		}
		var n [12]uint64
		ok := true
		for i, x := range f {
			v, err := strconv.ParseUint(x, 10, 64)
			if err != nil {
				ok = false
				break
			}
			n[i] = v
		}
		if !ok {
			continue
		}
		st = append(st, LUNStats{LUN: int(n[1]), Session: int(n[2]),
			ReadBytes: n[5], ReadCmds: n[6], WriteBytes: n[9], WriteCmds: n[10], Errors: n[11]})
	}
	return st, sc.Err()
}
