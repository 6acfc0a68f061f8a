package client

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeCerts creates a CA and a server certificate for "localhost" in dir,
// in the layout nbdkit, qemu and libnbd use (ca-cert.pem, server-cert.pem,
// server-key.pem).
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vmsan test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(srvKey)
	w := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	w("ca-cert.pem", "CERTIFICATE", caDER)
	w("server-cert.pem", "CERTIFICATE", srvDER)
	w("server-key.pem", "PRIVATE KEY", keyDER)
}

func TestTLS(t *testing.T) {
	certs := t.TempDir()
	writeCerts(t, certs)
	uri := nbdkit(t, "--tls=require", "--tls-certificates="+certs, "memory", "8M")
	sock := uri[len("nbd+unix:///?socket="):]

	// Plain NBD is refused by a TLS-only server.
	if c, err := Dial(t.Context(), uri, nil); err == nil {
		c.Close()
		t.Fatal("plain connection to --tls=require server succeeded")
	}
	c := dial(t, "nbds+unix:///?socket="+sock+"&tls-certificates="+certs, nil)
	if !c.Export().TLS {
		t.Fatal("TLS not recorded")
	}
	buf := []byte("over TLS, pipelined")
	if _, err := c.WriteAt(buf, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if _, err := c.ReadAt(got, 4096); err != nil || string(got) != string(buf) {
		t.Fatalf("TLS round trip: %q, %v", got, err)
	}
	// A server certificate from an unknown CA is rejected.
	other := t.TempDir()
	writeCerts(t, other)
	if c2, err := Dial(t.Context(), "nbds+unix:///?socket="+sock+"&tls-certificates="+other, nil); err == nil {
		c2.Close()
		t.Fatal("certificate from an unknown CA accepted")
	}
}
