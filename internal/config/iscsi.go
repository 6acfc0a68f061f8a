package config

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// DefaultISCSIPort is the IANA iSCSI port.
const DefaultISCSIPort = 3260

// DefaultISCSIListen is the portal of `iscsi: {enable: true}` without a
// listen list: loopback only, like the NBD default.
const DefaultISCSIListen = "127.0.0.1:3260"

// DefaultISCSIIQNPrefix prefixes the node's IQN:
// iqn.2026-11.org.vmsan:NODE.
const DefaultISCSIIQNPrefix = "iqn.2026-11.org.vmsan:"

// iSCSI target modes.
const (
	ISCSIModeNode      = "node"       // one target, every volume a LUN
	ISCSIModePerVolume = "per-volume" // one target per volume (IQN:VOLUME), LUN 0
)

// ISCSI is the iSCSI front end's configuration (`iscsi:`). The front end
// is off unless Listen has an entry (from the file or --iscsi-listen) or
// Enable is set (then it listens on DefaultISCSIListen).
//
//	iscsi:
//	  listen: ["0.0.0.0:3260", {addr: "10.0.1.5:3260", tpgt: 2}]
//	  node_name: host1            # default: the host name
//	  mode: node                  # or per-volume
//	  discovery_auth: {user: disc, secret_file: /etc/vmsan/disc.secret}
//	  auth: {user: u, secret: "twelve+chars", mutual_user: t, mutual_secret: "other+secret"}
//	  initiators: [iqn.1993-08.org.debian:01:abc]   # ACL (or CHAP, or allow_any: true)
//	  targets:                    # per-volume overrides (mode per-volume)
//	    - {volume: db, initiators: [iqn.2020-01.com.example:db1]}
//
// A replicated pair (docs/iscsi.md "HA pair") presents each replicated
// volume as one logical unit on both nodes: mode per-volume, the same
// scsi_id for the volume on both nodes, node-unique portal group tags and
// relative port ids, and each node lists the other's portals:
//
//	iscsi:
//	  mode: per-volume
//	  listen: [{addr: "10.0.0.1:3260", tpgt: 1, relative_port: 1}]
//	  peer_portals: [{addr: "10.0.0.2:3260", tpgt: 2, relative_port: 2}]
//	  targets: [{volume: db, scsi_id: 5f0c2d9e-0b7e-4c55-9a41-2b1f0e9f6c11}]
type ISCSI struct {
	// Enable turns the front end on with the default portal when Listen
	// is empty.
	Enable bool          `yaml:"enable,omitempty"`
	Listen []ISCSIPortal `yaml:"listen,omitempty"`
	// PeerPortals are the portals of the other node of a replicated pair:
	// not listened on, but listed (with their groups) in REPORT TARGET
	// PORT GROUPS for replicated volumes, so an initiator sees both
	// nodes' paths as one logical unit with asymmetric access states.
	// Their tpgt and relative_port must differ from this node's.
	PeerPortals []ISCSIPortal `yaml:"peer_portals,omitempty"`
	// NodeName names the node in the IQN (default: the host name).
	NodeName string `yaml:"node_name,omitempty"`
	// IQN overrides the node's IQN (default DefaultISCSIIQNPrefix+NodeName).
	IQN  string `yaml:"iqn,omitempty"`
	Mode string `yaml:"mode,omitempty"`
	// DiscoveryAuth makes CHAP mandatory for SendTargets discovery.
	DiscoveryAuth *ISCSIAuth `yaml:"discovery_auth,omitempty"`
	// Auth makes CHAP mandatory for every target's normal sessions.
	Auth *ISCSIAuth `yaml:"auth,omitempty"`
	// Initiators is the ACL by initiator IQN. A target with neither an
	// ACL nor CHAP (Auth, or its Targets override) refuses every login
	// (status 0202) and is listed to no one by discovery, unless AllowAny.
	Initiators []string `yaml:"initiators,omitempty"`
	// AllowAny lets any initiator log in to targets without an ACL or
	// CHAP (the target is open to whoever reaches a portal). It must be
	// set explicitly: the default refuses, loopback portals included.
	AllowAny bool `yaml:"allow_any,omitempty"`
	// DropRevokedSessions: a reload (SIGHUP) that takes an initiator's
	// access away (ACL, CHAP credentials, allow_any) also closes its open
	// sessions; by default they keep going and only new logins see the
	// change.
	DropRevokedSessions bool `yaml:"drop_revoked_sessions,omitempty"`
	// Targets override Auth and Initiators per volume (per-volume mode).
	Targets []ISCSITarget `yaml:"targets,omitempty"`
	// QueueDepth is the CmdSN window per session (default 128).
	QueueDepth int `yaml:"queue_depth,omitempty"`
	// MaxSessions bounds open sessions, discovery included (default 256).
	MaxSessions int `yaml:"max_sessions,omitempty"`
	// NopInterval pings silent initiators (default 1s; negative: never);
	// NopTimeout closes a connection that stays silent after a ping
	// (default 1s). Their sum must stay below the hosts' failover time
	// (docs/iscsi.md "What happens on each failure"; the daemon warns).
	NopInterval Duration `yaml:"nop_interval,omitempty"`
	NopTimeout  Duration `yaml:"nop_timeout,omitempty"`
	// LoginTimeout closes a connection that has not completed its login
	// by then (default 15s).
	LoginTimeout Duration `yaml:"login_timeout,omitempty"`
	// MaxPendingLogins bounds the connections still logging in (default
	// 64, and at most an eighth of the process's file descriptor limit):
	// past it a new connection is closed at once.
	MaxPendingLogins int `yaml:"max_pending_logins,omitempty"`
	// DataOutTimeout closes a connection whose command waited this long
	// for the next part of its write data, after an R2T (default 3s;
	// negative: never), releasing what the session held.
	DataOutTimeout Duration `yaml:"dataout_timeout,omitempty"`
}

// ISCSIPortal is one listener and its target portal group tag. In YAML
// either "HOST:PORT" or {addr: HOST:PORT, tpgt: N}.
type ISCSIPortal struct {
	Addr string `yaml:"addr"`
	TPGT uint16 `yaml:"tpgt,omitempty"` // 0: 1
	// RelativePort is the relative target port identifier (SPC-4 VPD 83
	// type 4); 0: the portal's position in the list, from 1. Set it in a
	// replicated pair so that the two nodes' ports differ.
	RelativePort uint16 `yaml:"relative_port,omitempty"`
}

// Rel is the relative target port identifier of the i-th portal (from 0)
// of a list.
func (p ISCSIPortal) Rel(i int) uint16 {
	if p.RelativePort != 0 {
		return p.RelativePort
	}
	return uint16(i + 1)
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

// validatePortalAddr checks HOST:PORT with a numeric port 0..65535 (0:
// any free port, for tests; SendTargets advertises the bound one).
func validatePortalAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q: want 0..65535", port)
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
	// SCSIID replaces the volume's UUID as the source of its SCSI
	// identity (the NAA designator and unit serial number of VPD 83/80).
	// Each node gives its volumes their own random UUID, so the two
	// replicas of a replicated pair differ: give the volume the same
	// scsi_id on both nodes (e.g. the primary's UUID, `vmsan volume info`)
	// so that initiators see one logical unit. Any mode.
	SCSIID string `yaml:"scsi_id,omitempty"`
}

// SCSIIDs maps volumes to their configured scsi_id.
func (c *ISCSI) SCSIIDs() map[string]string {
	out := map[string]string{}
	for _, t := range c.Targets {
		if t.SCSIID != "" {
			out[t.Volume] = t.SCSIID
		}
	}
	return out
}

// Enabled says the iSCSI front end is configured.
func (c *ISCSI) Enabled() bool { return len(c.Listen) > 0 || c.Enable }

// Portals returns the portals to listen on: Listen, or the default portal
// when only Enable is set.
func (c *ISCSI) Portals() []ISCSIPortal {
	if len(c.Listen) > 0 {
		return c.Listen
	}
	if c.Enable {
		return []ISCSIPortal{{Addr: DefaultISCSIListen}}
	}
	return nil
}

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
	errs = append(errs, c.validatePorts()...)
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
		if t.SCSIID != "" && len(hexDigits(t.SCSIID)) != 32 {
			add("%s.scsi_id %q: want a UUID (32 hex digits, dashes allowed)", where, t.SCSIID)
		}
	}
	if c.QueueDepth < 0 || c.QueueDepth > 4096 {
		add("iscsi.queue_depth %d: want 1..4096", c.QueueDepth)
	}
	if c.MaxSessions < 0 || c.MaxSessions > 65535 {
		add("iscsi.max_sessions %d: want 1..65535 (0: default 256)", c.MaxSessions)
	}
	if c.MaxPendingLogins < 0 || c.MaxPendingLogins > 65535 {
		add("iscsi.max_pending_logins %d: want 1..65535 (0: default 64)", c.MaxPendingLogins)
	}
	if c.LoginTimeout < 0 {
		add("iscsi.login_timeout %v: want a positive duration (0: default 15s)", time.Duration(c.LoginTimeout))
	}
	return errs
}

// hexDigits keeps the hex digits of s (a UUID without its dashes).
func hexDigits(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F':
			b = append(b, c)
		case c == '-':
		default:
			return ""
		}
	}
	return string(b)
}

// validatePorts checks the target port identities: relative port ids are
// unique across this node's and the peer's portals (both nodes report one
// logical unit, whose ports SPC-4 requires to be distinct), and a portal
// group is either this node's or the peer's, never both (ALUA states are
// per group, and the two nodes' groups change state independently).
func (c *ISCSI) validatePorts() []string {
	var errs []string
	add := func(f string, x ...any) { errs = append(errs, fmt.Sprintf(f, x...)) }
	rels := map[uint16]string{}
	own := map[uint16]bool{}
	for i, p := range c.Portals() {
		r := p.Rel(i)
		if prev, ok := rels[r]; ok {
			add("iscsi.listen %q: relative_port %d already used by %q", p.Addr, r, prev)
		}
		rels[r] = p.Addr
		own[p.Tag()] = true
	}
	if len(c.PeerPortals) > 0 && c.ModeOrDefault() != ISCSIModePerVolume {
		add("iscsi.peer_portals: a replicated pair needs mode per-volume (ALUA states are per volume: each node is primary for some volumes only)")
	}
	for _, p := range c.PeerPortals {
		if err := p.validate(); err != nil {
			add("iscsi.peer_portals: %v", err)
		}
		if p.RelativePort == 0 {
			add("iscsi.peer_portals %q: relative_port is required (the peer's own setting)", p.Addr)
		} else if prev, ok := rels[p.RelativePort]; ok {
			add("iscsi.peer_portals %q: relative_port %d already used by %q", p.Addr, p.RelativePort, prev)
		} else {
			rels[p.RelativePort] = p.Addr
		}
		if own[p.Tag()] {
			add("iscsi.peer_portals %q: tpgt %d is also one of this node's portal groups (give each node its own)", p.Addr, p.Tag())
		}
	}
	return errs
}

// WithoutAccess returns c without the settings a reload applies to a
// running daemon (CHAP credentials, ACLs, allow_any,
// drop_revoked_sessions, per-volume auth and initiators): what is left
// needs a restart when it changes.
func (c ISCSI) WithoutAccess() ISCSI {
	c.DiscoveryAuth, c.Auth, c.Initiators, c.AllowAny, c.DropRevokedSessions = nil, nil, nil, false, false
	var ts []ISCSITarget
	for _, t := range c.Targets {
		t.Auth, t.Initiators = nil, nil
		if t.SCSIID != "" {
			ts = append(ts, t)
		}
	}
	c.Targets = ts
	return c
}

// WithAccessOf returns c with o's access settings (see WithoutAccess),
// keeping c's other settings: per-volume entries take auth and
// initiators from o and scsi_id from c.
func (c ISCSI) WithAccessOf(o ISCSI) ISCSI {
	c.DiscoveryAuth, c.Auth, c.Initiators, c.AllowAny, c.DropRevokedSessions = o.DiscoveryAuth, o.Auth, o.Initiators, o.AllowAny, o.DropRevokedSessions
	ids := c.SCSIIDs()
	var ts []ISCSITarget
	seen := map[string]bool{}
	for _, t := range o.Targets {
		t.SCSIID = ids[t.Volume]
		seen[t.Volume] = true
		ts = append(ts, t)
	}
	for _, t := range c.Targets {
		if !seen[t.Volume] && t.SCSIID != "" {
			ts = append(ts, ISCSITarget{Volume: t.Volume, SCSIID: t.SCSIID})
		}
	}
	c.Targets = ts
	return c
}
