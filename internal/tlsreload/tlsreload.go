// Package tlsreload holds a TLS server's material so that it can be
// reloaded under running listeners: new handshakes get the files loaded
// last, established connections keep the config their handshake used.
// The daemon gives Base to the NBD server and calls Reload on SIGHUP.
package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/vmsan/vmsan/internal/config"
)

// Server is the NBD listeners' TLS material. The *tls.Config the NBD
// server holds (Base) carries only GetConfigForClient, which hands every
// new handshake the config loaded last; Reload swaps that one. An
// established connection keeps the config its handshake used, so a
// certificate rotation never touches a connected client.
type Server struct {
	cur atomic.Pointer[tls.Config]
}

// New loads t; nil, nil when TLS is off.
func New(t config.TLS) (*Server, error) {
	if t.Mode == "" || t.Mode == "off" {
		return nil, nil
	}
	c, err := loadTLS(t)
	if err != nil {
		return nil, err
	}
	s := &Server{}
	s.cur.Store(c)
	return s, nil
}

// Base is the config given to the NBD server.
func (s *Server) Base() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load(), nil
		},
	}
}

// Reload re-reads the files of t; on error the loaded config stays.
func (s *Server) Reload(t config.TLS) error {
	c, err := loadTLS(t)
	if err != nil {
		return err
	}
	s.cur.Store(c)
	return nil
}

// loadTLS reads the certificate, key and CA files of t into a complete
// server config.
//
// Client certificates are required (when a CA is set) but verified here, in
// VerifyConnection, rather than by crypto/tls (ClientCAs with
// RequireAndVerifyClientCert), so that the CertificateRequest carries no
// certificate_authorities list. With the list, GnuTLS clients (QEMU,
// libnbd) holding an RSA key sent no certificate over TLS 1.3: GnuTLS
// picks the certificate whose issuer is among the CA names only if the
// certificate's key algorithm is among those of the offered signature
// schemes, and for RSA Go offers (as TLS 1.3 requires) only the
// rsa_pss_rsae_* schemes, which GnuTLS files under RSA-PSS, not RSA. Without
// the list, GnuTLS sends its one configured certificate and signs with
// rsa_pss_rsae, which is valid; ECDSA keys worked either way. The
// verification below is what crypto/tls does itself: the chain to the CA,
// intermediates from the client, extended key usage clientAuth, validity
// dates.
func loadTLS(t config.TLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		return nil, fmt.Errorf("tls cert %s, key %s: %w", t.Cert, t.Key, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, fmt.Errorf("tls ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca %s: no certificates found", t.CA)
		}
		c.ClientAuth = tls.RequireAnyClientCert
		c.VerifyConnection = verifyClientCert(pool)
	}
	return c, nil
}

// verifyClientCert checks the client's chain against roots. crypto/tls
// calls it on every handshake, resumed ones included, and has already
// checked that the client proved it holds the key.
func verifyClientCert(roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			// RequireAnyClientCert refuses this before we are called.
			return errors.New("tls: client didn't provide a certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots:         roots,
			Intermediates: inter,
			KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err != nil {
			return fmt.Errorf("tls: client certificate refused: %w", err)
		}
		return nil
	}
}
