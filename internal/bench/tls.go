package bench

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// addTLSFiles loads --tls-ca and --tls-cert/--tls-key into cfg.
func addTLSFiles(cfg *tls.Config, o TargetOptions) error {
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("bench: no certificate in %s", o.TLSCA)
		}
		cfg.RootCAs = pool
	}
	if o.TLSCert != "" {
		kp, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return fmt.Errorf("bench: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return nil
}
