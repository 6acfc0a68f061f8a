package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// DefaultPort is the IANA port for NBD.
const DefaultPort = "10809"

// Address is a parsed NBD URI (the NBD URI specification, as used by
// qemu, libnbd and nbdinfo).
type Address struct {
	Network string // "tcp" or "unix"
	Addr    string // host:port or socket path
	Host    string // for TLS server-name checks
	Export  string
	TLS     bool
	// TLSCertDir is the tls-certificates= directory (ca-cert.pem,
	// client-cert.pem, client-key.pem, as qemu and libnbd lay it out).
	TLSCertDir string
	// TLSNoVerify is tls-verify-peer=false.
	TLSNoVerify bool
}

// ParseURI parses nbd://host[:port]/[export], nbds://..., and
// nbd+unix:///[export]?socket=PATH (or nbds+unix).
func ParseURI(s string) (Address, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Address{}, fmt.Errorf("nbd: bad URI: %w", err)
	}
	var a Address
	switch u.Scheme {
	case "nbd", "nbds":
		a.Network = "tcp"
		if u.Host == "" {
			return a, errors.New("nbd: URI has no host")
		}
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil {
			host, port = u.Host, DefaultPort
			host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		}
		a.Host = host
		a.Addr = net.JoinHostPort(host, port)
	case "nbd+unix", "nbds+unix":
		a.Network = "unix"
		a.Addr = u.Query().Get("socket")
		if a.Addr == "" {
			return a, errors.New("nbd: nbd+unix URI needs ?socket=PATH")
		}
		a.Host = "localhost"
	default:
		return a, fmt.Errorf("nbd: unsupported URI scheme %q", u.Scheme)
	}
	a.TLS = strings.HasPrefix(u.Scheme, "nbds")
	a.Export = strings.TrimPrefix(u.Path, "/")
	if len(a.Export) > 4096 {
		return a, errors.New("nbd: export name longer than 4096 bytes")
	}
	q := u.Query()
	a.TLSCertDir = q.Get("tls-certificates")
	a.TLSNoVerify = q.Get("tls-verify-peer") == "false"
	return a, nil
}

// TLSConfigFromDir builds a client TLS configuration from a qemu/libnbd
// style certificate directory: ca-cert.pem (trust anchor), and optionally
// client-cert.pem with client-key.pem (client authentication).
func TLSConfigFromDir(dir, serverName string, noVerify bool) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12, InsecureSkipVerify: noVerify}
	if dir == "" {
		return cfg, nil
	}
	if ca, err := os.ReadFile(filepath.Join(dir, "ca-cert.pem")); err == nil {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("nbd: no certificate in %s/ca-cert.pem", dir)
		}
		cfg.RootCAs = pool
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	cert, kerr := filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem")
	if _, err := os.Stat(cert); err == nil {
		kp, err := tls.LoadX509KeyPair(cert, kerr)
		if err != nil {
			return nil, fmt.Errorf("nbd: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return cfg, nil
}
