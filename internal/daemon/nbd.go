package daemon

import (
	"crypto/tls"
	"net"
	"os"
	"strings"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/nbdfront"
	"github.com/vmsan/vmsan/internal/netutil"
)

// newNBDFrontEnd binds the configured NBD listeners (Unix sockets with the
// daemon's socket mode and stale-socket handling, listen) and builds the
// NBD front end (package nbd/nbdfront) over them.
func newNBDFrontEnd(d *Daemon) (FrontEnd, error) {
	var tlsCfg *tls.Config
	if d.tls != nil {
		tlsCfg = d.tls.Base() // follows reloads (internal/tlsreload)
	}
	c := nbdfront.Config{TLS: tlsCfg, TLSMode: d.cfg.TLS.Mode, ClientCA: d.cfg.TLS.CA != "",
		MaxPayload: uint32(d.cfg.MaxPayload), MaxConns: d.cfg.MaxConnections,
		// Connections still in the handshake are not the data path yet:
		// at most an eighth of the descriptors (fdShare).
		MaxPendingHandshakes: fdShare(d.cfg.MaxPendingHandshakes, 64, 8),
		HandshakeTimeout:     time.Duration(d.cfg.HandshakeTimeout)}
	for _, l := range d.cfg.Listeners() {
		ln, err := listen(l)
		if err != nil {
			for _, ln := range c.Listeners {
				ln.Close()
				if a, ok := ln.Addr().(*net.UnixAddr); ok {
					os.Remove(a.Name)
				}
			}
			return nil, err
		}
		c.Listeners = append(c.Listeners, ln)
		if p, ok := strings.CutPrefix(l, "unix:"); ok && len(p) > netutil.MaxSunPath {
			d.log.Warn("NBD socket path is longer than sun_path (107 bytes); most clients cannot connect to it, use --listen unix:SHORTER_PATH", "path", p)
		}
	}
	d.nbd = nbdfront.New(feHost{d}, c)
	return d.nbd, nil
}
