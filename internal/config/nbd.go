package config

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// NBD is the NBD front end's section (`nbd:`), beside `iscsi:`:
//
//	nbd:
//	  listen: ["127.0.0.1:10809", "unix:/run/vmsan/nbd.sock"]
//	  tls: {mode: required, cert: server-cert.pem, key: server-key.pem}
//	  max_payload: 32M
//	  max_connections: 1024
//	  max_pending_handshakes: 64
//	  handshake_timeout: 30s
//
// The first four keys were once at the top level of the file; they are still read
// there, and Config.Deprecated names each one found, so that the daemon
// logs a note at start and `vmsan serve --print-config` shows the new form.
//
// After decoding, the settings live in Config's fields Listen, TLS,
// MaxPayload and MaxConnections (what the daemon reads); Config.NBD is
// then empty. Marshal writes them back under nbd:.
type NBD struct {
	Listen         []string `yaml:"listen,omitempty"`
	TLS            *TLS     `yaml:"tls,omitempty"`
	MaxPayload     Size     `yaml:"max_payload,omitempty"`
	MaxConnections int      `yaml:"max_connections,omitempty"`
	// Newer than the section: read here only.
	MaxPendingHandshakes int      `yaml:"max_pending_handshakes,omitempty"`
	HandshakeTimeout     Duration `yaml:"handshake_timeout,omitempty"`
}

// nbdTopLevelKeys are the NBD keys read at the top level for files
// written before the nbd: section.
var nbdTopLevelKeys = []string{"listen", "tls", "max_payload", "max_connections"}

// foldNBD moves the nbd: section into the fields the daemon reads and
// records the top-level NBD keys the file used (top: the keys at the
// file's top level). A key set in both places is an error: which one
// wins would be a guess.
func (c *Config) foldNBD(top map[string]bool) error {
	n := c.NBD
	c.NBD = NBD{}
	var both []string
	for _, k := range nbdTopLevelKeys {
		if !top[k] {
			continue
		}
		c.Deprecated = append(c.Deprecated, k)
		set := map[string]bool{"listen": n.Listen != nil, "tls": n.TLS != nil,
			"max_payload": n.MaxPayload != 0, "max_connections": n.MaxConnections != 0}[k]
		if set {
			both = append(both, k)
		}
	}
	if len(both) > 0 {
		return fmt.Errorf("%s set both at the top level and under nbd:; keep the nbd: ones (the top-level keys are deprecated)",
			strings.Join(both, ", "))
	}
	if n.Listen != nil {
		c.Listen = n.Listen
	}
	if n.TLS != nil {
		c.TLS = *n.TLS
	}
	if n.MaxPayload != 0 {
		c.MaxPayload = n.MaxPayload
	}
	if n.MaxConnections != 0 {
		c.MaxConnections = n.MaxConnections
	}
	if n.MaxPendingHandshakes != 0 {
		c.MaxPendingHandshakes = n.MaxPendingHandshakes
	}
	if n.HandshakeTimeout != 0 {
		c.HandshakeTimeout = n.HandshakeTimeout
	}
	return nil
}

// DeprecationNotes are the lines the daemon logs at start for the
// deprecated keys the configuration file used (Deprecated).
func (c *Config) DeprecationNotes() []string {
	out := make([]string, 0, len(c.Deprecated))
	for _, k := range c.Deprecated {
		out = append(out, fmt.Sprintf("config: top-level %q is deprecated; move it under nbd: (nbd.%s; `vmsan serve --print-config` shows the new form)", k, k))
	}
	return out
}

// topLevelKeys are the keys of b's top-level mapping.
func topLevelKeys(b []byte) map[string]bool {
	var n yaml.Node
	if yaml.Unmarshal(b, &n) != nil || len(n.Content) == 0 || n.Content[0].Kind != yaml.MappingNode {
		return nil
	}
	m := n.Content[0]
	out := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		out[m.Content[i].Value] = true
	}
	return out
}

// plainConfig is Config without its MarshalYAML.
type plainConfig Config

// MarshalYAML writes the NBD settings under nbd: (the form files should
// use), not at the top level.
func (c Config) MarshalYAML() (any, error) {
	p := plainConfig(c)
	p.NBD = NBD{Listen: c.Listen, MaxPayload: c.MaxPayload, MaxConnections: c.MaxConnections,
		MaxPendingHandshakes: c.MaxPendingHandshakes, HandshakeTimeout: c.HandshakeTimeout}
	if c.TLS != (TLS{}) {
		t := c.TLS
		p.NBD.TLS = &t
	}
	p.Listen, p.TLS, p.MaxPayload, p.MaxConnections = nil, TLS{}, 0, 0
	p.Deprecated = nil
	return p, nil
}
