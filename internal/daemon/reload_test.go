package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/testutil"
)

// fingerprint is the SHA-256 of a DER certificate, as hex.
func fingerprint(der []byte) string {
	s := sha256.Sum256(der)
	return hex.EncodeToString(s[:8])
}

// tlsClient dials export over nbds:// with the client certificate and CA of
// certs and returns the connection and the fingerprint of the certificate
// the server presented.
func tlsClient(t *testing.T, addr, export string, certs testutil.TLSCerts) (*client.Conn, string, error) {
	return tlsClientAs(t, addr, export, certs, certs.Client)
}

// tlsClientAs is tlsClient presenting the client certificate cc.
func tlsClientAs(t *testing.T, addr, export string, certs testutil.TLSCerts, cc tls.Certificate) (*client.Conn, string, error) {
	t.Helper()
	var seen string
	cfg := &tls.Config{
		RootCAs: certs.CAPool, Certificates: []tls.Certificate{cc}, ServerName: "localhost",
		VerifyConnection: func(cs tls.ConnectionState) error {
			seen = fingerprint(cs.PeerCertificates[0].Raw)
			return nil
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, "nbds://"+addr+"/"+export, &client.Options{TLSConfig: cfg, Connections: 1})
	return c, seen, err
}

// checkIO writes a block through c and reads it back.
func checkIO(t *testing.T, c *client.Conn, what string, fill byte) {
	t.Helper()
	w := bytes.Repeat([]byte{fill}, 4096)
	if _, err := c.WriteAt(w, int64(fill)*4096); err != nil {
		t.Fatalf("%s: write: %v", what, err)
	}
	r := make([]byte, 4096)
	if _, err := c.ReadAt(r, int64(fill)*4096); err != nil {
		t.Fatalf("%s: read: %v", what, err)
	}
	if !bytes.Equal(r, w) {
		t.Fatalf("%s: read back differs", what)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	// Rename into place, as certificate tools do, so the daemon never
	// reads a half-written file.
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		t.Fatal(err)
	}
}

// TestSIGHUPReload runs the real binary with a config file and sends it
// SIGHUP four times: after adding a volume (and changing a restart-only
// setting), after rotating the TLS certificate, key and CA in place, with
// a broken config file, and with a broken certificate. The daemon must stay
// up throughout, a client connected before the first SIGHUP must keep
// working, the new volume must be exported, new connections must get the
// new certificate (and the old CA must no longer be trusted), and a broken
// reload must be logged and leave everything as it was. It ends with
// SIGTERM and a clean exit.
func TestSIGHUPReload(t *testing.T) {
	nbdinfo := testutil.NeedTool(t, "nbdinfo")
	bin := buildBinary(t)
	data := t.TempDir()
	etc := t.TempDir()
	certsA := testutil.WriteTLSCertsKey(t, t.TempDir(), testutil.ECDSA)
	certsB := testutil.WriteTLSCertsKey(t, t.TempDir(), testutil.RSA)
	install := func(c testutil.TLSCerts) {
		copyFile(t, c.File("server-cert.pem"), filepath.Join(etc, "server.pem"))
		copyFile(t, c.File("server-key.pem"), filepath.Join(etc, "server.key"))
		copyFile(t, c.File("ca-cert.pem"), filepath.Join(etc, "ca.pem"))
	}
	install(certsA)
	cfgPath := filepath.Join(etc, "vmsan.yaml")
	writeCfg := func(extra string) {
		t.Helper()
		y := fmt.Sprintf("data_dir: %s\nlisten: [\"127.0.0.1:0\"]\nno_default_volume: true\n"+
			"tls: {mode: required, cert: server.pem, key: server.key, ca: ca.pem}\n%s", data, extra)
		if err := os.WriteFile(cfgPath, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg("volumes:\n  - {name: vm1, size: 16M}\n")

	logs := &syncBuffer{}
	srv := exec.Command(bin, "serve", "--config", cfgPath)
	srv.Stdout, srv.Stderr = logs, logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		srv.Process.Kill()
		<-exited
	})
	alive := func(after string) {
		t.Helper()
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("daemon exited after %s: %v\nlog:\n%s", after, err, logs.String())
		default:
		}
	}
	var addr string
	waitFor(t, "the daemon to serve", func() bool {
		alive("start")
		c, err := Dial(data)
		if err != nil {
			return false
		}
		defer c.Close()
		st, err := c.Status()
		if err != nil || len(st.Listeners) == 0 {
			return false
		}
		addr = st.Listeners[0]
		return true
	})
	hup := func(wantLine string, n int) {
		t.Helper()
		if err := srv.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, fmt.Sprintf("log line %q #%d", wantLine, n), func() bool {
			alive("SIGHUP")
			return strings.Count(logs.String(), wantLine) >= n
		})
		// Give a dying process a moment to show it.
		time.Sleep(100 * time.Millisecond)
		alive("SIGHUP")
	}
	fpA, fpB := fingerprint(certsA.Server.Certificate[0]), fingerprint(certsB.Server.Certificate[0])

	held, fp, err := tlsClient(t, addr, "vm1", certsA)
	if err != nil {
		t.Fatalf("connecting before any reload: %v\nlog:\n%s", err, logs.String())
	}
	defer held.Close()
	if fp != fpA {
		t.Fatalf("server certificate %s, want %s", fp, fpA)
	}
	checkIO(t, held, "held connection before SIGHUP", 1)

	// 1. A new volume and a restart-only change.
	writeCfg("max_payload: 16M\nvolumes:\n  - {name: vm1, size: 16M}\n  - {name: vm2, size: 8M}\n")
	hup("configuration reloaded", 1)
	checkIO(t, held, "held connection after SIGHUP 1", 2)
	out, err := exec.Command(nbdinfo, "--size", "nbds://"+addr+"/vm2?tls-certificates="+certsA.Dir).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != fmt.Sprint(8<<20) {
		t.Fatalf("nbdinfo on the volume added by reload: %v: %s\nlog:\n%s", err, out, logs.String())
	}
	if !strings.Contains(logs.String(), "max_payload changed; restart to apply") {
		t.Errorf("no log line naming max_payload as needing a restart:\n%s", logs.String())
	}

	// 2. Rotate certificate, key and CA in place.
	install(certsB)
	hup("configuration reloaded", 2)
	c, fp, err := tlsClient(t, addr, "vm2", certsB)
	if err != nil {
		t.Fatalf("connecting with the rotated certificates: %v\nlog:\n%s", err, logs.String())
	}
	if fp != fpB {
		t.Errorf("after rotation the server presented %s, want the new certificate %s (old: %s)", fp, fpB, fpA)
	}
	checkIO(t, c, "new connection after rotation", 3)
	c.Close()
	// Trusting the new server certificate but presenting a client
	// certificate from the replaced CA: the server must refuse it.
	if c, _, err := tlsClientAs(t, addr, "vm1", certsB, certsA.Client); err == nil {
		c.Close()
		t.Errorf("a client certificate from the replaced CA was accepted after the CA was rotated")
	}
	waitFor(t, "the server to log the refused client certificate", func() bool {
		return strings.Contains(logs.String(), "client certificate refused")
	})
	out, err = exec.Command(nbdinfo, "--size", "nbds://"+addr+"/vm1?tls-certificates="+certsB.Dir).CombinedOutput()
	if err != nil {
		t.Errorf("nbdinfo with the rotated (RSA) certificates: %v: %s", err, out)
	}
	checkIO(t, held, "held connection after certificate rotation", 4)

	// 3. A broken config file.
	if err := os.WriteFile(cfgPath, []byte("data_dri: typo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("reload rejected", 1)
	checkIO(t, held, "held connection after a broken config", 5)

	// 4. A valid config naming a broken certificate: the loaded one stays.
	writeCfg("volumes:\n  - {name: vm1, size: 16M}\n  - {name: vm2, size: 8M}\n")
	if err := os.WriteFile(filepath.Join(etc, "server.pem"), []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("reload rejected", 2)
	c, fp, err = tlsClient(t, addr, "vm1", certsB)
	if err != nil {
		t.Fatalf("connecting after a rejected certificate: %v\nlog:\n%s", err, logs.String())
	}
	if fp != fpB {
		t.Errorf("after a rejected reload the server presented %s, want %s", fp, fpB)
	}
	c.Close()
	checkIO(t, held, "held connection after a broken certificate", 6)
	held.Close()

	if err := srv.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v\nlog:\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit within 30s of SIGTERM\nlog:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "shutdown complete") {
		t.Errorf("no clean-shutdown line:\n%s", logs.String())
	}
	if testing.Verbose() {
		t.Logf("daemon log:\n%s", logs.String())
	}
}

// TestReloadInProcess drives Reload directly (so the race detector sees it
// beside live I/O): a volume added and exported, a replication change and a
// restart-only change named in the log, an invalid config rejected.
func TestReloadInProcess(t *testing.T) {
	dir := t.TempDir()
	logs := &syncBuffer{}
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Listen = []string{"127.0.0.1:0"}
	cfg.NoDefaultVolume = true
	rep := &config.Replication{Listen: "127.0.0.1:25990", Peer: "127.0.0.1:25991", SharedSecret: "reload-test-shared-secret"}
	cfg.Volumes = []config.Volume{{Name: "a", Size: 8 << 20}, {Name: "r", Size: 8 << 20, Replication: rep}}
	d, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	addr := d.NBDAddrs()[0].String()

	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	c, err := client.Dial(cctx, "nbd://"+addr+"/a", &client.Options{Connections: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stopIO := make(chan struct{})
	ioErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for i := 0; ; i++ {
			select {
			case <-stopIO:
				ioErr <- nil
				return
			default:
			}
			if _, err := c.WriteAt(buf, int64(i%256)*4096); err != nil {
				ioErr <- err
				return
			}
		}
	}()

	next := cfg
	next.MetricsListen = "127.0.0.1:0"
	rep2 := *rep
	rep2.Protocol = "A"
	next.Volumes = []config.Volume{{Name: "a", Size: 8 << 20, Rotational: true}, {Name: "r", Size: 8 << 20, Replication: &rep2}, {Name: "b", Size: 4 << 20}}
	if err := d.Reload(next); err != nil {
		t.Fatalf("reload: %v\nlog:\n%s", err, logs.String())
	}
	for _, want := range []string{
		"metrics_listen changed; restart to apply",
		`replication settings changed; restart to apply" volume=r`,
		`clients hold the volume`, // "a" is connected: its rotational flag waits
		`created volume from config" volume=b`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	cb, err := client.Dial(cctx, "nbd://"+addr+"/b", &client.Options{Connections: 1})
	if err != nil {
		t.Fatalf("volume added by reload is not exported: %v", err)
	}
	if cb.Size() != 4<<20 {
		t.Errorf("b: size %d", cb.Size())
	}
	cb.Close()

	bad := next
	bad.Volumes = append(bad.Volumes[:len(bad.Volumes):len(bad.Volumes)], config.Volume{Name: "../x", Size: 1})
	if err := d.Reload(bad); err == nil {
		t.Fatal("invalid configuration accepted")
	}
	if _, err := d.store.Get("x"); err == nil {
		t.Fatal("rejected reload created a volume")
	}
	close(stopIO)
	if err := <-ioErr; err != nil {
		t.Fatalf("I/O during reloads: %v", err)
	}
}
