// Package servers starts NBD servers as child processes so that tests and
// benchmarks can point real NBD clients (qemu-io, qemu-img, nbdinfo, nbdcopy,
// fio) at them. The server under test is vmsan; nbdkit, qemu-nbd and
// nbd-server are the anchors it is compared against.
//
// Simplest use:
//
//	s, err := servers.Start(ctx, servers.NBDKit, servers.Options{File: "/data/disk.raw", Export: "disk"})
//	if err != nil { ... }
//	defer s.Stop()
//	run("qemu-io", "-f", "raw", s.URI, ...)
//
// For vmsan, Options.Binary and Options.DataDir name the built binary and the
// data directory; the volume named Options.Export must already exist there
// (create it with CreateVMSANVolume).
//
// Every server listens on 127.0.0.1 on a port picked from the ephemeral range
// (or Options.Port), serves exactly one export, and uses the host page cache
// (writeback semantics: a write is in the page cache when it is acknowledged,
// FLUSH means fdatasync). A Server is safe for use by one goroutine at a time;
// Stop may be called any number of times.
package servers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Kind names an NBD server implementation.
type Kind string

// The servers this package knows how to start.
const (
	VMSAN     Kind = "vmsan"
	NBDKit    Kind = "nbdkit"
	QEMUNBD   Kind = "qemu-nbd"
	NBDServer Kind = "nbd-server"
)

// AllKinds lists every supported server, vmsan first.
var AllKinds = []Kind{VMSAN, NBDKit, QEMUNBD, NBDServer}

// ParseKind maps a name (as printed by Kind) to a Kind.
func ParseKind(s string) (Kind, error) {
	for _, k := range AllKinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("unknown NBD server %q (want one of vmsan, nbdkit, qemu-nbd, nbd-server)", s)
}

// Executable is the program that must be on PATH (or, for vmsan, built) to
// start this kind of server.
func (k Kind) Executable() string { return string(k) }

// Options describe what to serve.
type Options struct {
	// File is the raw image served by the anchors. For vmsan it is ignored:
	// vmsan serves the volume Export from DataDir.
	File string
	// Export is the export name clients connect to (nbdkit ignores the name
	// and serves the file under any name).
	Export string
	// ReadOnly serves the export read-only (anchors only; a vmsan volume's
	// read-only flag lives in its metadata).
	ReadOnly bool
	// Port to listen on; 0 picks a free ephemeral port.
	Port int
	// LogDir receives <kind>.log with the server's stdout and stderr; "" uses
	// a fresh temporary directory.
	LogDir string

	// Binary is the vmsan executable (VMSAN only).
	Binary string
	// DataDir is vmsan's --data-dir (VMSAN only).
	DataDir string
	// ExtraArgs are appended to the server's command line.
	ExtraArgs []string
	// TLSDir, when set, makes the server require TLS with the certificates
	// in DIR (testutil.WriteTLSCerts layout: ca-cert.pem, server-cert.pem,
	// server-key.pem) and verify client certificates against ca-cert.pem.
	// Supported by vmsan, nbdkit and qemu-nbd.
	TLSDir string
	// ReadyTimeout bounds how long Start waits for the port to accept
	// connections; 0 means 15 s.
	ReadyTimeout time.Duration
}

// Server is a running NBD server process.
type Server struct {
	Kind   Kind
	Addr   string // host:port
	Export string
	URI    string // nbd://host:port/export
	Log    string // path of the combined stdout/stderr log

	cmd     *exec.Cmd
	logf    *os.File
	done    chan struct{}
	waitErr error
	tmp     string // config/log dir owned by this server, removed on Stop
	daemon  int    // nbd-server: pid of the daemonized server (cmd is only its launcher)
	once    sync.Once
	stopErr error
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. There
// is an unavoidable window between this call and the server binding it;
// Start retries with a new port if the server dies at start-up.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start launches a server of the given kind and waits until it accepts TCP
// connections.
func Start(ctx context.Context, kind Kind, o Options) (*Server, error) {
	if o.Export == "" {
		o.Export = "disk"
	}
	var lastErr error
	attempts := 3
	if o.Port != 0 {
		attempts = 1
	}
	for i := 0; i < attempts; i++ {
		s, err := start(ctx, kind, o)
		if err == nil {
			return s, nil
		}
		lastErr = err
		// Only a lost port race is worth a retry; anything else is final.
		if !errors.Is(err, errExitedEarly) {
			break
		}
	}
	return nil, lastErr
}

var errExitedEarly = errors.New("server exited during start-up")

func start(ctx context.Context, kind Kind, o Options) (*Server, error) {
	port := o.Port
	if port == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		port = p
	}
	tmp, err := os.MkdirTemp("", "nbdserver-"+string(kind)+"-")
	if err != nil {
		return nil, err
	}
	logDir := o.LogDir
	if logDir == "" {
		logDir = tmp
	}
	s := &Server{
		Kind:   kind,
		Addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Export: o.Export,
		Log:    filepath.Join(logDir, string(kind)+".log"),
		done:   make(chan struct{}),
		tmp:    tmp,
	}
	s.URI = "nbd://" + s.Addr + "/" + o.Export
	args, err := commandLine(kind, o, port, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	s.logf, err = os.OpenFile(s.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	fmt.Fprintf(s.logf, "### %s %s\n", time.Now().Format(time.RFC3339), strings.Join(args, " "))
	// Not exec.CommandContext: ctx bounds start-up only; the server must live
	// until Stop, whatever happens to ctx afterwards.
	s.cmd = exec.Command(args[0], args[1:]...)
	s.cmd.Stdout = s.logf
	s.cmd.Stderr = s.logf
	// Own process group so Stop can signal helpers a server may fork.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.logf.Close()
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("start %s: %w", kind, err)
	}
	launched := s.done
	go func() {
		s.waitErr = s.cmd.Wait()
		close(launched)
	}()
	if kind == NBDServer {
		if err := s.adoptDaemon(filepath.Join(tmp, "nbd-server.pid")); err != nil {
			s.Kill()
			return nil, err
		}
	}
	timeout := o.ReadyTimeout
	if timeout == 0 {
		timeout = 15 * time.Second
	}
	if err := s.waitReady(ctx, timeout); err != nil {
		s.Kill()
		return nil, err
	}
	return s, nil
}

// adoptDaemon waits for the nbd-server launcher to daemonize and exit, then
// tracks the daemon through its pid file. (nbd-server's own -d "no fork" mode
// serves a single client and exits, which is useless for a benchmark.)
func (s *Server) adoptDaemon(pidFile string) error {
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("nbd-server did not daemonize within 10s\n%s", s.LogTail(2000))
	}
	if s.waitErr != nil {
		return fmt.Errorf("nbd-server: %v\n%s", s.waitErr, s.LogTail(2000))
	}
	for i := 0; i < 100; i++ {
		b, err := os.ReadFile(pidFile)
		if err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				s.daemon = pid
				d := make(chan struct{})
				s.done = d
				go func() {
					for alive(pid) {
						time.Sleep(50 * time.Millisecond)
					}
					close(d)
				}()
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("nbd-server wrote no pid file %s", pidFile)
}

// alive reports whether pid exists and is not a zombie (a daemon is
// reparented to PID 1, which in a container may never reap it).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// Format: pid (comm) state ...; comm may contain spaces, so look after ')'.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// pid is the process that serves clients.
func (s *Server) pid() int {
	if s.daemon != 0 {
		return s.daemon
	}
	return s.cmd.Process.Pid
}

// waitReady polls until the port accepts a connection or the process dies.
func (s *Server) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		select {
		case <-s.done:
			return fmt.Errorf("%w: %s: %v\n%s", errExitedEarly, s.Kind, s.waitErr, s.LogTail(2000))
		default:
		}
		c, err := net.DialTimeout("tcp", s.Addr, 500*time.Millisecond)
		if err == nil {
			c.Close()
			// The port answering is not proof that it is OUR server: a
			// parallel test may have bound the same port between FreePort
			// and our bind, and then our server exits. vmsan says when it
			// serves; for the others, make sure the process is still there
			// a moment later.
			if s.Kind == VMSAN && !strings.Contains(s.LogTail(1<<16), "vmsan serving") {
				err = errors.New("port answers but vmsan has not logged \"vmsan serving\" yet")
			} else {
				select {
				case <-s.done:
					continue // reported at the top of the loop
				case <-time.After(100 * time.Millisecond):
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %v: %v\n%s", s.Kind, s.Addr, timeout, err, s.LogTail(2000))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func commandLine(kind Kind, o Options, port int, tmp string) ([]string, error) {
	p := strconv.Itoa(port)
	var args []string
	switch kind {
	case VMSAN:
		if o.Binary == "" || o.DataDir == "" {
			return nil, errors.New("vmsan needs Options.Binary and Options.DataDir")
		}
		args = []string{o.Binary, "serve", "--data-dir", o.DataDir, "--listen", "127.0.0.1:" + p}
		if o.TLSDir != "" {
			args = append(args, "--tls", "required",
				"--tls-cert", filepath.Join(o.TLSDir, "server-cert.pem"), "--tls-key", filepath.Join(o.TLSDir, "server-key.pem"),
				"--tls-ca", filepath.Join(o.TLSDir, "ca-cert.pem"))
		}
	case NBDKit:
		if o.File == "" {
			return nil, errors.New("nbdkit needs Options.File")
		}
		// -f: foreground, so the process we started is the server.
		// The file plugin defaults to the page cache (cache=default), which
		// is the writeback semantics all servers here are run with.
		args = []string{"nbdkit", "-f", "-i", "127.0.0.1", "-p", p, "-e", o.Export}
		if o.ReadOnly {
			args = append(args, "-r")
		}
		if o.TLSDir != "" {
			args = append(args, "--tls=require", "--tls-certificates="+o.TLSDir, "--tls-verify-peer")
		}
		args = append(args, "file", "file="+o.File)
	case QEMUNBD:
		if o.File == "" {
			return nil, errors.New("qemu-nbd needs Options.File")
		}
		// -t: persistent (otherwise it exits after the first client, which
		// would be our readiness probe). --shared=8 allows multi-conn (the
		// default is 1 client). --discard=unmap passes TRIM to the file (the
		// default ignores it). --cache=writeback --aio=threads is the page
		// cache with a thread pool, qemu's default for a raw file.
		args = []string{"qemu-nbd", "-f", "raw", "-t", "--shared=8", "-b", "127.0.0.1", "-p", p,
			"-x", o.Export, "--cache=writeback", "--aio=threads", "--discard=unmap"}
		if o.ReadOnly {
			args = append(args, "-r")
		}
		if o.TLSDir != "" {
			args = append(args, "--object", "tls-creds-x509,id=tls0,dir="+o.TLSDir+",endpoint=server,verify-peer=on", "--tls-creds", "tls0")
		}
		args = append(args, o.File)
	case NBDServer:
		if o.File == "" {
			return nil, errors.New("nbd-server needs Options.File")
		}
		if o.TLSDir != "" {
			return nil, errors.New("servers: TLSDir is not supported for nbd-server")
		}
		cfg := filepath.Join(tmp, "nbd-server.conf")
		var b bytes.Buffer
		fmt.Fprintf(&b, "[generic]\n\tlistenaddr = 127.0.0.1\n\tport = %d\n\tallowlist = true\n", port)
		fmt.Fprintf(&b, "[%s]\n\texportname = %s\n\treadonly = %t\n\tflush = true\n\tfua = true\n\ttrim = true\n",
			o.Export, o.File, o.ReadOnly)
		if err := os.WriteFile(cfg, b.Bytes(), 0o644); err != nil {
			return nil, err
		}
		// nbd-server daemonizes; Start follows it through the pid file. It
		// forks one child per client connection.
		args = []string{"nbd-server", "-C", cfg, "-p", filepath.Join(tmp, "nbd-server.pid")}
	default:
		return nil, fmt.Errorf("unknown server kind %q", kind)
	}
	return append(args, o.ExtraArgs...), nil
}

// PID of the server process.
func (s *Server) PID() int { return s.pid() }

// Stop sends SIGTERM (a graceful stop: vmsan drains and flushes) and waits up
// to 20 s, then SIGKILLs the process group. It returns the process's exit
// error, or an error if it had to be killed.
func (s *Server) Stop() error {
	s.once.Do(func() {
		_ = syscall.Kill(s.pid(), syscall.SIGTERM)
		select {
		case <-s.done:
			s.stopErr = s.waitErr
			if s.stopErr != nil && s.Kind != VMSAN {
				// Anchors report SIGTERM as their exit status; that is not
				// a failure of theirs.
				s.stopErr = nil
			}
		case <-time.After(20 * time.Second):
			s.killAll()
			<-s.done
			s.stopErr = fmt.Errorf("%s did not exit within 20s of SIGTERM; killed", s.Kind)
		}
		// Helpers a server forked (nbd-server's per-client children) go too.
		s.killAll()
		s.logf.Close()
		os.RemoveAll(s.tmp)
	})
	return s.stopErr
}

// Kill stops the server with SIGKILL at once (a crash, for restart tests).
func (s *Server) Kill() {
	s.once.Do(func() {
		s.killAll()
		<-s.done
		s.logf.Close()
		os.RemoveAll(s.tmp)
		s.stopErr = errors.New("killed")
	})
}

// killAll SIGKILLs the server and its process group (our launcher's group,
// and for a daemonized nbd-server the session it created).
func (s *Server) killAll() {
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	if s.daemon != 0 {
		_ = syscall.Kill(-s.daemon, syscall.SIGKILL)
		_ = syscall.Kill(s.daemon, syscall.SIGKILL)
	}
}

// LogTail returns at most the last n bytes of the server's log.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(s.Log)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// CreateVMSANVolume runs `vmsan volume create NAME --size SIZE --data-dir DIR`
// with any extra flags (e.g. "--read-only").
func CreateVMSANVolume(ctx context.Context, binary, dataDir, name string, size int64, extra ...string) error {
	args := append([]string{"volume", "create", name, "--size", strconv.FormatInt(size, 10), "--data-dir", dataDir}, extra...)
	out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("vmsan %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
