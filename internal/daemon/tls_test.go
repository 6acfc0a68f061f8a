package daemon

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
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
)

// writeCerts makes a CA and a server certificate for 127.0.0.1 in dir, named
// as libnbd expects (ca-cert.pem) plus server-cert.pem / server-key.pem.
func writeCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vmsan test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca-cert.pem", "CERTIFICATE", caDER)
	write("server-cert.pem", "CERTIFICATE", der)
	write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// TestTLSRequired checks the TLS settings reach the server: with mode
// required, nbdinfo over nbds:// with the CA succeeds and plain nbd:// is
// refused.
func TestTLSRequired(t *testing.T) {
	needTool(t, "nbdinfo")
	dir := t.TempDir()
	certs := t.TempDir()
	writeCerts(t, certs)
	r := start(t, dir, func(c *config.Config) {
		c.TLS = config.TLS{Mode: "required", Cert: filepath.Join(certs, "server-cert.pem"), Key: filepath.Join(certs, "server-key.pem")}
		c.Volumes = []config.Volume{{Name: "sec", Size: 8 << 20}}
	})
	if !strings.Contains(r.out.String(), "nbds://") {
		t.Errorf("banner does not show an nbds:// URL for TLS required:\n%s", r.out.String())
	}
	if n := nbdSize(t, "nbds://"+r.tcp()+"/sec?tls-certificates="+certs); n != 8<<20 {
		t.Fatalf("size over TLS: %d", n)
	}
	if out, err := exec.Command("nbdinfo", "--size", r.url("sec")).CombinedOutput(); err == nil {
		t.Fatalf("plain connection accepted with TLS required: %s", out)
	}
}
