package testutil

import (
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDiskTempDir: the directory exists, is not tmpfs, accepts O_DIRECT,
// and is a different directory on each call.
func TestDiskTempDir(t *testing.T) {
	a, b := DiskTempDir(t), DiskTempDir(t)
	if a == b {
		t.Fatalf("same dir twice: %s", a)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(a, &st); err != nil {
		t.Fatal(err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		t.Fatalf("%s is tmpfs", a)
	}
	f, err := os.OpenFile(filepath.Join(a, "x"), os.O_CREATE|os.O_RDWR|unix.O_DIRECT, 0o600)
	if err != nil {
		t.Fatalf("O_DIRECT in %s: %v", a, err)
	}
	f.Close()
}

// TestNeedToolFound: an installed program (sh is on every machine the
// tests run on) gives the path of an existing file.
func TestNeedToolFound(t *testing.T) {
	p := NeedTool(t, "sh")
	if fi, err := os.Stat(p); err != nil || fi.IsDir() {
		t.Fatalf("NeedTool(sh) = %q: %v", p, err)
	}
}

// TestWriteTLSCerts: the files load as key pairs, and a TLS handshake with
// the written server certificate verifies against the written CA for both
// "localhost" and 127.0.0.1, with client authentication by the client
// certificate; for each key type.
func TestWriteTLSCerts(t *testing.T) {
	for _, kt := range []KeyType{ECDSA, RSA} {
		t.Run(string(kt), func(t *testing.T) { testWriteTLSCerts(t, kt) })
	}
}

func testWriteTLSCerts(t *testing.T, kt KeyType) {
	c := WriteTLSCertsKey(t, t.TempDir(), kt)
	for _, name := range []string{"ca-cert.pem", "server-cert.pem", "server-key.pem", "client-cert.pem", "client-key.pem"} {
		if _, err := os.Stat(c.File(name)); err != nil {
			t.Fatal(err)
		}
	}
	srvPair, err := tls.LoadX509KeyPair(c.File("server-cert.pem"), c.File("server-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cliPair, err := tls.LoadX509KeyPair(c.File("client-cert.pem"), c.File("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(c.File("ca-cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("ca-cert.pem holds no certificate")
	}
	for _, serverName := range []string{"localhost", "127.0.0.1"} {
		srvCfg := &tls.Config{Certificates: []tls.Certificate{srvPair}, ClientCAs: c.CAPool, ClientAuth: tls.RequireAndVerifyClientCert}
		cliCfg := &tls.Config{RootCAs: roots, ServerName: serverName, Certificates: []tls.Certificate{cliPair}}
		if cerr, serr := handshake(t, srvCfg, cliCfg); cerr != nil || serr != nil {
			t.Fatalf("%s: client handshake %v, server handshake %v", serverName, cerr, serr)
		}
	}
	if kt == RSA {
		if _, ok := srvPair.PrivateKey.(*rsa.PrivateKey); !ok {
			t.Fatalf("server key is %T, want RSA", srvPair.PrivateKey)
		}
	}
	// A second call makes a different CA: its server is not trusted by the first.
	other := WriteTLSCertsKey(t, t.TempDir(), kt)
	cerr, _ := handshake(t, &tls.Config{Certificates: []tls.Certificate{other.Server}}, &tls.Config{RootCAs: c.CAPool, ServerName: "localhost"})
	if cerr == nil {
		t.Fatal("certificate from another test CA verified")
	}
}

// handshake runs one TLS handshake over loopback TCP (kernel-buffered, so
// post-handshake messages such as session tickets cannot block the peer)
// with deadlines, and returns both sides' errors.
func handshake(t *testing.T, srvCfg, cliCfg *tls.Config) (cliErr, srvErr error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		errc <- tls.Server(nc, srvCfg).Handshake()
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(20 * time.Second))
	cli := tls.Client(nc, cliCfg)
	cliErr = cli.Handshake()
	cli.Close()
	return cliErr, <-errc
}
