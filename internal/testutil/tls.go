package testutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
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

// TLSCerts is what WriteTLSCerts made: the files in Dir and the same
// material in memory for crypto/tls configurations.
type TLSCerts struct {
	Dir    string         // holds the files below
	CAPool *x509.CertPool // trusts only the test CA
	Server tls.Certificate
	Client tls.Certificate
}

// File returns the path of one of the written files, e.g. "server-key.pem".
func (c TLSCerts) File(name string) string { return filepath.Join(c.Dir, name) }

// KeyType selects the key algorithm of the certificates WriteTLSCertsKey
// makes.
type KeyType string

// Key types. Both matter: GnuTLS clients (qemu, libnbd) pick their client
// certificate differently for RSA and ECDSA keys in TLS 1.3.
const (
	ECDSA KeyType = "ecdsa" // P-256
	RSA   KeyType = "rsa"   // 2048 bits
)

// WriteTLSCerts is WriteTLSCertsKey with ECDSA keys.
func WriteTLSCerts(t testing.TB, dir string) TLSCerts { return WriteTLSCertsKey(t, dir, ECDSA) }

// WriteTLSCertsKey creates a fresh test CA and, signed by it, a server and a
// client certificate, and writes them into dir in the layout nbdkit, qemu
// (tls-creds-x509 dir=) and libnbd (tls-certificates=) expect:
// ca-cert.pem, server-cert.pem, server-key.pem, client-cert.pem,
// client-key.pem. Every key (CA included) is of type kt, in PKCS#8
// ("PRIVATE KEY"), which both Go and GnuTLS read. Leaf certificates carry
// digitalSignature (TLS 1.3 signs with every key type) and
// keyEncipherment. The server certificate is valid for "localhost" and
// 127.0.0.1, for a day either side of now.
func WriteTLSCertsKey(t testing.TB, dir string, kt KeyType) TLSCerts {
	t.Helper()
	newKey := func() crypto.Signer {
		var k crypto.Signer
		var err error
		switch kt {
		case ECDSA:
			k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		case RSA:
			k, err = rsa.GenerateKey(rand.Reader, 2048)
		default:
			t.Fatalf("WriteTLSCertsKey: unknown key type %q", kt)
		}
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	writePEM := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "vmsan test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	writePEM("ca-cert.pem", "CERTIFICATE", caDER)
	issue := func(serial int64, cn string, usage x509.ExtKeyUsage, prefix string) tls.Certificate {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, k.Public(), caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(prefix+"-cert.pem", "CERTIFICATE", der)
		writePEM(prefix+"-key.pem", "PRIVATE KEY", kd)
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k}
	}
	c := TLSCerts{Dir: dir, CAPool: x509.NewCertPool()}
	c.CAPool.AddCert(ca)
	c.Server = issue(2, "localhost", x509.ExtKeyUsageServerAuth, "server")
	c.Client = issue(3, "client", x509.ExtKeyUsageClientAuth, "client")
	return c
}
