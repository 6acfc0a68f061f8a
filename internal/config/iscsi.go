package config

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// DefaultISCSIPort is the IANA iSCSI port.
const DefaultISCSIPort = 3260

// DefaultISCSIIQNPrefix prefixes the node's IQN:
// iqn.2026-11.org.vmsan:NODE.
const DefaultISCSIIQNPrefix = "iqn.2026-11.org.vmsan:"

// iSCSI target modes.
const (
	ISCSIModeNode      = "node"       // one target, every volume a LUN
	ISCSIModePerVolume = "per-volume" // one target per volume (IQN:VOLUME), LUN 0
)

// ISCSI is the iSCSI front end's configuration (`iscsi:`). The front end
// is off unless Listen has an entry (from the file or --iscsi-listen).
//
//	iscsi:
//	  listen: ["0.0.0.0:3260", {addr: "10.0.1.5:3260", tpgt: 2}]
//	  node_name: host1            # default: the host name
//	  mode: node                  # or per-volume
//	  discovery_auth: {user: disc, secret_file: /etc/vmsan/disc.secret}
//	  auth: {user: u, secret: "twelve+chars", mutual_user: t, mutual_secret: "other+secret"}
//	  initiators: [iqn.1993-08.org.debian:01:abc]
//	  targets:                    # per-volume overrides (mode per-volume)
//	    - {volume: db, initiators: [iqn.2020-01.com.example:db1]}
type ISCSI struct {
	Listen []ISCSIPortal `yaml:"listen,omitempty"`
	// NodeName names the node in the IQN (default: the host name).
	NodeName string `yaml:"node_name,omitempty"`
	// IQN overrides the node's IQN (default DefaultISCSIIQNPrefix+NodeName).
	IQN  string `yaml:"iqn,omitempty"`
	Mode string `yaml:"mode,omitempty"`
	// DiscoveryAuth makes CHAP mandatory for SendTargets discovery.
	DiscoveryAuth *ISCSIAuth `yaml:"discovery_auth,omitempty"`
	// Auth makes CHAP mandatory for every target's normal sessions.
	Auth *ISCSIAuth `yaml:"auth,omitempty"`
	// Initiators is the ACL by initiator IQN (empty: any initiator).
	Initiators []string `yaml:"initiators,omitempty"`
	// Targets override Auth and Initiators per volume (per-volume mode).
	Targets []ISCSITarget `yaml:"targets,omitempty"`
	// QueueDepth is the CmdSN window per session (default 128).
	QueueDepth int `yaml:"queue_depth,omitempty"`
	// NopInterval pings idle initiators (default 5s; negative: never);
	// NopTimeout closes a connection that stays silent after a ping
	// (default 15s).
	NopInterval Duration `yaml:"nop_interval,omitempty"`
	NopTimeout  Duration `yaml:"nop_timeout,omitempty"`
}

// ISCSIPortal is one listener and its target portal group tag. In YAML
// either "HOST:PORT" or {addr: HOST:PORT, tpgt: N}.
type ISCSIPortal struct {
	Addr string `yaml:"addr"`
	TPGT uint16 `yaml:"tpgt,omitempty"` // 0: 1
}

// UnmarshalYAML accepts the short scalar form.
func (p *ISCSIPortal) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		p.Addr = n.Value
		return nil
	}
	type plain ISCSIPortal
	var v plain
	if err := n.Decode(&v); err != nil {
		return err
	}
	*p = ISCSIPortal(v)
	return nil
}

// ParseISCSIPortal parses a --iscsi-listen value: HOST[:PORT][,TPGT].
func ParseISCSIPortal(s string) (ISCSIPortal, error) {
	var p ISCSIPortal
	addr := s
	if i := strings.LastIndexByte(s, ','); i >= 0 {
		t, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || t == 0 {
			return p, fmt.Errorf("iscsi listen %q: portal group tag: want 1..65535", s)
		}
		p.TPGT, addr = uint16(t), s[:i]
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(strings.Trim(addr, "[]"), strconv.Itoa(DefaultISCSIPort))
	}
	p.Addr = addr
	return p, p.validate()
}

// validatePortalAddr checks HOST:PORT with a numeric port 1..65535.
func validatePortalAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1..65535", port)
	}
	return nil
}

func (p ISCSIPortal) validate() error {
	if strings.HasPrefix(p.Addr, "unix:") {
		return fmt.Errorf("iscsi listen %q: iSCSI listens on TCP only", p.Addr)
	}
	if err := validatePortalAddr(p.Addr); err != nil {
		return fmt.Errorf("iscsi listen %q: %v", p.Addr, err)
	}
	return nil
}

// Tag is the portal group tag (default 1).
func (p ISCSIPortal) Tag() uint16 {
	if p.TPGT == 0 {
		return 1
	}
	return p.TPGT
}

// ISCSIAuth is CHAP credentials: User/Secret the initiator proves, and
// MutualUser/MutualSecret the target answers with when the initiator asks
// for mutual CHAP. Secrets may come from files (first line, trimmed).
type ISCSIAuth struct {
	User             string `yaml:"user"`
	Secret           string `yaml:"secret,omitempty"`
	SecretFile       string `yaml:"secret_file,omitempty"`
	MutualUser       string `yaml:"mutual_user,omitempty"`
	MutualSecret     string `yaml:"mutual_secret,omitempty"`
	MutualSecretFile string `yaml:"mutual_secret_file,omitempty"`
}

// ISCSITarget is the per-volume override.
type ISCSITarget struct {
	Volume     string     `yaml:"volume"`
	Auth       *ISCSIAuth `yaml:"auth,omitempty"`
	Initiators []string   `yaml:"initiators,omitempty"`
}

// Enabled says the iSCSI front end is configured.
func (c *ISCSI) Enabled() bool { return len(c.Listen) > 0 }

// TargetName returns the node's IQN.
func (c *ISCSI) TargetName() string {
	if c.IQN != "" {
		return c.IQN
	}
	n := c.NodeName
	if n == "" {
		n, _ = os.Hostname()
	}
	return DefaultISCSIIQNPrefix + iqnPart(n)
}

// iqnPart lowercases a host name into the characters an IQN allows.
func iqnPart(s string) string {
	s = strings.ToLower(s)
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == ':') {
			b[i] = '-'
		}
	}
	if len(b) == 0 {
		return "node"
	}
	return string(b)
}

// ModeOrDefault returns the mode ("node" when unset).
func (c *ISCSI) ModeOrDefault() string {
	if c.Mode == "" {
		return ISCSIModeNode
	}
	return c.Mode
}

// iSCSI names (RFC 7143 4.2.7): iqn.YYYY-MM.reversed.domain[:anything],
// eui.16HEX or naa.16/32HEX; we check the shape and the 223-byte limit.
var iscsiNameRE = regexp.MustCompile(`^(iqn\.\d{4}-\d{2}\.[a-z0-9.-]+(:[a-z0-9.:_-]*)?|eui\.[0-9a-fA-F]{16}|naa\.[0-9a-fA-F]{16}([0-9a-fA-F]{16})?)$`)

// ValidISCSIName checks an iSCSI name's shape.
func ValidISCSIName(s string) bool { return len(s) <= 223 && iscsiNameRE.MatchString(s) }

// Secret returns the secret (from the file if set).
func (a *ISCSIAuth) secret(inline, file string) (string, error) {
	if file == "" {
		return inline, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line), nil
}

// Secrets returns the one-way and mutual secrets, reading files.
func (a *ISCSIAuth) Secrets() (secret, mutual string, err error) {
	if secret, err = a.secret(a.Secret, a.SecretFile); err != nil {
		return "", "", err
	}
	if mutual, err = a.secret(a.MutualSecret, a.MutualSecretFile); err != nil {
		return "", "", err
	}
	return secret, mutual, nil
}

func (a *ISCSIAuth) validate(where string) []string {
	var errs []string
	add := func(f string, x ...any) { errs = append(errs, where+": "+fmt.Sprintf(f, x...)) }
	if a.User == "" {
		add("user is required")
	}
	if (a.Secret == "") == (a.SecretFile == "") {
		add("set exactly one of secret and secret_file")
	}
	if a.MutualSecret != "" && a.MutualSecretFile != "" {
		add("set at most one of mutual_secret and mutual_secret_file")
	}
	if (a.MutualUser != "") != (a.MutualSecret != "" || a.MutualSecretFile != "") {
		add("mutual_user and a mutual secret go together")
	}
	// RFC 7143 12.1.3: at least 96 bits; CHAP's MD5 makes short secrets
	// brute-forceable from one captured exchange.
	for _, s := range []struct{ name, v string }{{"secret", a.Secret}, {"mutual_secret", a.MutualSecret}} {
		if s.v != "" && (len(s.v) < 12 || len(s.v) > 255) {
			add("%s: want 12 to 255 bytes", s.name)
		}
	}
	if a.Secret != "" && a.Secret == a.MutualSecret {
		add("secret and mutual_secret must differ (RFC 7143 12.1.3)")
	}
	return errs
}

func (a *ISCSIAuth) resolve(rel func(string) string) {
	if a != nil {
		a.SecretFile, a.MutualSecretFile = rel(a.SecretFile), rel(a.MutualSecretFile)
	}
}

// resolvePaths makes secret file names relative to the config file.
func (c *ISCSI) resolvePaths(rel func(string) string) {
	c.DiscoveryAuth.resolve(rel)
	c.Auth.resolve(rel)
	for i := range c.Targets {
		c.Targets[i].Auth.resolve(rel)
	}
}

func (c *ISCSI) validate() []string {
	var errs []string
	add := func(f string, x ...any) { errs = append(errs, fmt.Sprintf(f, x...)) }
	seen := map[string]bool{}
	for _, p := range c.Listen {
		if err := p.validate(); err != nil {
			add("iscsi.listen: %v", err)
		}
		if seen[p.Addr] {
			add("iscsi.listen %q: listed twice", p.Addr)
		}
		seen[p.Addr] = true
	}
	switch c.Mode {
	case "", ISCSIModeNode, ISCSIModePerVolume:
	default:
		add("iscsi.mode %q: want node or per-volume", c.Mode)
	}
	if c.IQN != "" && !ValidISCSIName(c.IQN) {
		add("iscsi.iqn %q: not an iSCSI name (iqn.YYYY-MM.domain:name, lower case)", c.IQN)
	}
	if c.DiscoveryAuth != nil {
		errs = append(errs, c.DiscoveryAuth.validate("iscsi.discovery_auth")...)
	}
	if c.Auth != nil {
		errs = append(errs, c.Auth.validate("iscsi.auth")...)
	}
	for _, n := range c.Initiators {
		if !ValidISCSIName(n) {
			add("iscsi.initiators %q: not an iSCSI name", n)
		}
	}
	for i, t := range c.Targets {
		where := fmt.Sprintf("iscsi.targets[%d]", i)
		if t.Volume == "" {
			add("%s.volume is required", where)
		}
		if t.Auth != nil {
			errs = append(errs, t.Auth.validate(where+".auth")...)
		}
		for _, n := range t.Initiators {
			if !ValidISCSIName(n) {
				add("%s.initiators %q: not an iSCSI name", where, n)
			}
		}
	}
	if c.QueueDepth < 0 || c.QueueDepth > 4096 {
		add("iscsi.queue_depth %d: want 1..4096", c.QueueDepth)
	}
	return errs
}
