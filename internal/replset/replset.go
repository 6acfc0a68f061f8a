// Package replset is a replicated volume's settings: the one type that
// the configuration file (config.Replication decodes into it), the
// settings file `vmsan repl configure` writes (repl/driver), the CLI flags
// and the replication state machine's tick-based configuration all derive
// from. Times are durations; Ticks converts them to the state machine's
// ticks, the only place that conversion happens.
//
// Simplest use:
//
//	s := replset.Settings{Listen: "10.0.0.1:7789", Peer: "10.0.0.2:7789"}
//	if err := s.Validate(); err != nil { ... }   // defaults applied first
//	t := s.Ticks()                                 // tick length, counts, rates per tick
//
// It also holds the protocol and split-brain policy enumerations with
// their parsers (internal/repl uses them under its own names), so that
// config can validate a replication section without importing the
// replication subsystem.
//
// Layering: replset imports nothing from the project (the layering test
// checks it): config, repl and repl/driver all import it.
package replset

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// Protocol is the replication protocol: when a write counts as done.
type Protocol uint8

const (
	ProtoC Protocol = iota // durable on both (default)
	ProtoA                 // locally durable and handed to the send path
	ProtoB                 // locally durable and received (in memory) by the peer
)

func (p Protocol) String() string { return [...]string{"C", "A", "B"}[p%3] }

// ParseProtocol accepts "A", "B", "C" (empty means C).
func ParseProtocol(s string) (Protocol, error) {
	switch s {
	case "", "C", "c":
		return ProtoC, nil
	case "A", "a":
		return ProtoA, nil
	case "B", "b":
		return ProtoB, nil
	}
	return 0, fmt.Errorf("repl: unknown protocol %q (want A, B or C)", s)
}

// SplitBrainPolicy says what to do when the handshake finds split brain.
type SplitBrainPolicy uint8

const (
	// SBDisconnect (default) never resolves: both go StandAlone and report.
	SBDisconnect SplitBrainPolicy = iota
	// SBDiscardZeroChanges: if exactly one side wrote nothing since the
	// split, it becomes sync target; otherwise disconnect.
	SBDiscardZeroChanges
	// SBDiscardYoungerPrimary: the side promoted most recently is discarded.
	SBDiscardYoungerPrimary
	// SBDiscardLeastChanges: the side with fewer changed blocks is discarded
	// (ties broken by node id).
	SBDiscardLeastChanges
)

var sbNames = [...]string{"disconnect", "discard-zero-changes", "discard-younger-primary", "discard-least-changes"}

func (p SplitBrainPolicy) String() string {
	if int(p) < len(sbNames) {
		return sbNames[p]
	}
	return fmt.Sprintf("SplitBrainPolicy(%d)", p)
}

// ParseSplitBrainPolicy parses the drbd.conf-style names (empty means
// disconnect).
func ParseSplitBrainPolicy(s string) (SplitBrainPolicy, error) {
	if s == "" {
		return SBDisconnect, nil
	}
	for i, n := range sbNames {
		if n == s {
			return SplitBrainPolicy(i), nil
		}
	}
	return 0, fmt.Errorf("repl: unknown split-brain policy %q", s)
}

// Duration is a time.Duration written as a Go duration string ("1s") in
// JSON and text, so settings files stay readable.
type Duration time.Duration

// MarshalText writes the duration as a string ("1.5s").
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText parses a time.ParseDuration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Settings configure one replicated volume. Zero fields mean the default
// (Defaults); Listen and Peer are required.
type Settings struct {
	// Listen is this node's replication address for the volume, Peer the
	// other node's. The node whose Listen sorts lower dials; the other only
	// accepts, so the two never race to build two connections.
	Listen string `json:"listen"`
	Peer   string `json:"peer"`
	// Protocol "A", "B" or "C" (default).
	Protocol string `json:"protocol,omitempty"`
	// Role at the very first start ("primary" or "secondary", default);
	// afterwards the persisted role wins (change it with promote/demote).
	Role string `json:"role,omitempty"`
	// SplitBrain policy: disconnect (default), discard-zero-changes,
	// discard-younger-primary, discard-least-changes.
	SplitBrain string `json:"split_brain,omitempty"`
	// Dial: "auto" (default: the lower Listen dials), "yes" or "no". Set
	// explicitly when the peer address is a proxy or NAT address.
	Dial string `json:"dial,omitempty"`
	// NodeID identifies this node (random, chosen by `vmsan repl
	// configure`); not a setting of the configuration file.
	NodeID uint64 `json:"node_id,omitempty"`

	// Tick is the state machine's clock period; 0 (the default) derives it
	// from PingInterval (see Ticks).
	Tick Duration `json:"tick,omitempty"`
	// PingInterval between pings; PingTimeout of silence from the peer
	// before disconnecting; KoTimeout a replicated write may stay
	// unacknowledged (while pings still answer) before the peer is dropped.
	PingInterval Duration `json:"ping_interval,omitempty"`
	PingTimeout  Duration `json:"ping_timeout,omitempty"`
	KoTimeout    Duration `json:"ko_timeout,omitempty"`
	// ALRetire: activity-log extents idle this long are retired.
	ALRetire Duration `json:"al_retire,omitempty"`
	// ResyncRate in bytes per second (0: unlimited); with ResyncMinRate the
	// dynamic controller gives resync what application writes leave.
	ResyncRate    int64 `json:"resync_rate,omitempty"`
	ResyncMinRate int64 `json:"resync_min_rate,omitempty"`
	// Checksum: resync sends hashes first and data only where they differ.
	Checksum bool `json:"checksum_resync,omitempty"`

	// SharedSecret authenticates the peer: on every replication
	// connection both nodes prove they hold it (HMAC-SHA256 over fresh
	// nonces of both sides) before any replication message is sent or
	// accepted. SharedSecretFile names a file holding it instead (its
	// first line, trimmed; read at each start). Both nodes need the same
	// secret; one of the two is required unless Insecure (AuthProblem).
	SharedSecret     string `json:"shared_secret,omitempty"`
	SharedSecretFile string `json:"shared_secret_file,omitempty"`
	// Insecure runs the link without a secret: any process that reaches
	// the port from an accepted address can take the link over.
	Insecure bool `json:"insecure,omitempty"`
	// AcceptFrom lists the addresses (IPs or CIDR prefixes) replication
	// connections are accepted from; empty means the peer host's own
	// addresses. Others are closed before anything is read. Set it when
	// the peer's connections arrive from another address (a proxy, NAT).
	AcceptFrom []string `json:"accept_from,omitempty"`
}

// Shared secret length bounds, in bytes: HMAC keys shorter than 16 bytes
// are guessable offline from one observed handshake.
const (
	MinSecretLen = 16
	MaxSecretLen = 1024
)

// ErrNoSecret: a replicated volume has neither a shared secret nor
// Insecure set (AuthProblem).
var ErrNoSecret = errors.New("no shared secret configured: the peer could not be authenticated")

// AuthProblem is nil when the link can authenticate its peer (a secret
// is set) or is explicitly Insecure, else an error wrapping ErrNoSecret
// naming what to set. It is apart from Problems so that settings stored
// before secrets existed still load (delete and resize checks read them);
// starting replication and configuring it require it.
func (s Settings) AuthProblem() error {
	if s.Insecure || s.SharedSecret != "" || s.SharedSecretFile != "" {
		return nil
	}
	return fmt.Errorf("%w: set shared_secret_file (vmsan repl configure --shared-secret-file FILE, or replication.shared_secret_file "+
		"in the config file) to a file holding the same secret on both nodes (e.g. `openssl rand -base64 32`), "+
		"or insecure: true (--insecure) to accept unauthenticated peers", ErrNoSecret)
}

// Secret returns the shared secret (read from SharedSecretFile when set),
// nil when Insecure. REQUIRES: AuthProblem() == nil.
func (s Settings) Secret() ([]byte, error) {
	v := s.SharedSecret
	if s.SharedSecretFile != "" {
		b, err := os.ReadFile(s.SharedSecretFile)
		if err != nil {
			return nil, fmt.Errorf("shared_secret_file: %w", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		v = strings.TrimSpace(line)
		if len(v) < MinSecretLen || len(v) > MaxSecretLen {
			return nil, fmt.Errorf("shared_secret_file %s: the secret (first line) has %d bytes, want %d to %d", s.SharedSecretFile, len(v), MinSecretLen, MaxSecretLen)
		}
	}
	if v == "" {
		return nil, nil
	}
	return []byte(v), nil
}

// Defaults are the settings every zero field takes (DRBD's are similar:
// ping-int 10 s, ping-timeout 0.5 s, ko-count 7 × timeout 6 s; ours favour
// detecting a dead peer within seconds on a LAN).
func Defaults() Settings {
	return Settings{
		Protocol:     "C",
		Role:         "secondary",
		SplitBrain:   "disconnect",
		Dial:         "auto",
		PingInterval: Duration(time.Second),
		PingTimeout:  Duration(6 * time.Second),
		KoTimeout:    Duration(10 * time.Second),
		ALRetire:     Duration(5 * time.Second),
	}
}

// WithDefaults returns s with zero fields set from Defaults (Tick stays 0:
// derived in Ticks).
func (s Settings) WithDefaults() Settings {
	d := Defaults()
	or := func(v *string, def string) {
		if *v == "" {
			*v = def
		}
	}
	ord := func(v *Duration, def Duration) {
		if *v == 0 {
			*v = def
		}
	}
	or(&s.Protocol, d.Protocol)
	or(&s.Role, d.Role)
	or(&s.SplitBrain, d.SplitBrain)
	or(&s.Dial, d.Dial)
	ord(&s.PingInterval, d.PingInterval)
	ord(&s.PingTimeout, d.PingTimeout)
	ord(&s.KoTimeout, d.KoTimeout)
	ord(&s.ALRetire, d.ALRetire)
	return s
}

// Problems returns one message per problem of s (defaults applied first),
// each starting with the configuration file's key ("peer ...: ..."), so a
// caller can prefix where the settings came from. Nil means valid.
func (s Settings) Problems() []string {
	var errs []string
	add := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	s = s.WithDefaults()
	for _, a := range []struct{ key, v string }{{"listen", s.Listen}, {"peer", s.Peer}} {
		if a.v == "" {
			add("%s: required (HOST:PORT)", a.key)
		} else if err := validateHostPort(a.v); err != nil {
			add("%s %q: %v", a.key, a.v, err)
		}
	}
	if s.Listen != "" && s.Listen == s.Peer {
		add("peer %q: must differ from listen", s.Peer)
	}
	switch s.Role {
	case "primary", "secondary":
	default:
		add("role %q: want primary or secondary", s.Role)
	}
	if _, err := ParseProtocol(s.Protocol); err != nil {
		add("protocol %q: want A, B or C", s.Protocol)
	}
	switch s.Dial {
	case "auto", "yes", "no":
	default:
		add("dial %q: want auto, yes or no", s.Dial)
	}
	if _, err := ParseSplitBrainPolicy(s.SplitBrain); err != nil {
		add("split_brain_policy %q: want disconnect, discard-zero-changes, discard-younger-primary or discard-least-changes", s.SplitBrain)
	}
	pi, pt, ko := time.Duration(s.PingInterval), time.Duration(s.PingTimeout), time.Duration(s.KoTimeout)
	if pi < 10*time.Millisecond || pi > time.Minute {
		add("ping_interval %v: want 10ms..1m", pi)
	}
	if pt <= pi || pt > 10*time.Minute {
		add("ping_timeout %v: want more than ping_interval (%v) and at most 10m", pt, pi)
	}
	if ko < 10*time.Millisecond || ko > time.Hour {
		add("ko_timeout %v: want 10ms..1h", ko)
	}
	if al := time.Duration(s.ALRetire); al < 0 || al > 24*time.Hour {
		add("al_retire %v: want at most 24h", al)
	}
	if t := time.Duration(s.Tick); t != 0 && (t < time.Millisecond || t > 10*time.Second) {
		add("tick %v: want 1ms..10s (or 0: derived from ping_interval)", t)
	}
	if s.ResyncRate < 0 || s.ResyncMinRate < 0 {
		add("resync_rate/resync_min_rate: must not be negative")
	}
	if s.ResyncMinRate > 0 && (s.ResyncRate == 0 || s.ResyncMinRate > s.ResyncRate) {
		add("resync_min_rate %d: needs resync_rate set and at least as large", s.ResyncMinRate)
	}
	if s.SharedSecret != "" && s.SharedSecretFile != "" {
		add("shared_secret: set at most one of shared_secret and shared_secret_file")
	}
	if n := len(s.SharedSecret); n > 0 && (n < MinSecretLen || n > MaxSecretLen) {
		// The value itself is never part of a message.
		add("shared_secret: %d bytes, want %d to %d", n, MinSecretLen, MaxSecretLen)
	}
	if s.Insecure && (s.SharedSecret != "" || s.SharedSecretFile != "") {
		add("insecure: set together with a shared secret: remove one")
	}
	for _, a := range s.AcceptFrom {
		if _, err := ParseAcceptFrom(a); err != nil {
			add("accept_from %q: %v", a, err)
		}
	}
	return errs
}

// Validate returns nil when s (with defaults) is valid, else every problem
// in one error.
func (s Settings) Validate() error {
	p := s.Problems()
	if len(p) == 0 {
		return nil
	}
	return errors.New("repl: " + strings.Join(p, "; "))
}

// validateHostPort checks a TCP HOST:PORT with a numeric port 1..65535
// (the peer must be able to dial it, so port 0 is refused).
func validateHostPort(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("want HOST:PORT: %v", err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q: want 1..65535", port)
	}
	return nil
}

// ParseAcceptFrom parses one AcceptFrom entry: an IP address or a CIDR
// prefix (an address is its own /32 or /128).
func ParseAcceptFrom(a string) (netip.Prefix, error) {
	if strings.Contains(a, "/") {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return p, errors.New("want an IP address or a CIDR prefix (10.0.0.0/24)")
		}
		return p.Masked(), nil
	}
	ip, err := netip.ParseAddr(a)
	if err != nil {
		return netip.Prefix{}, errors.New("want an IP address or a CIDR prefix (10.0.0.0/24)")
	}
	ip = ip.Unmap()
	return netip.PrefixFrom(ip, ip.BitLen()), nil
}

// Ticks are the settings in the state machine's units (repl.Config).
type Ticks struct {
	// Tick is the clock period, a whole number of milliseconds.
	Tick time.Duration
	// PingInterval, PingTimeout, KoTicks and ALRetireTicks are in ticks,
	// each at least 1.
	PingInterval, PingTimeout, KoTicks, ALRetireTicks int
	// ResyncRate and ResyncMinRate are bytes per tick (0: unlimited; a set
	// rate is at least 1 byte per tick).
	ResyncRate, ResyncMinRate int64
}

// Ticks converts s (with defaults) to ticks: the one place durations
// become ticks. The tick is Tick when set, else a tenth of the ping
// interval clamped to 10..100 ms, so every timeout keeps at least ten
// ticks of resolution; it is truncated to whole milliseconds, and every
// timeout rounds up to whole ticks.
func (s Settings) Ticks() Ticks {
	s = s.WithDefaults()
	tick := time.Duration(s.Tick)
	if tick <= 0 {
		tick = min(max(time.Duration(s.PingInterval)/10, 10*time.Millisecond), 100*time.Millisecond)
	}
	tick = max(tick.Truncate(time.Millisecond), time.Millisecond)
	ticks := func(d Duration) int { return max(1, int((time.Duration(d)+tick-1)/tick)) }
	t := Ticks{
		Tick:          tick,
		PingInterval:  ticks(s.PingInterval),
		PingTimeout:   ticks(s.PingTimeout),
		KoTicks:       ticks(s.KoTimeout),
		ALRetireTicks: ticks(s.ALRetire),
	}
	if s.ResyncRate > 0 {
		ms := tick.Milliseconds()
		// rate*ms/1000 without overflowing for any int64 rate.
		perTick := func(r int64) int64 { return r/1000*ms + r%1000*ms/1000 }
		t.ResyncRate = max(1, perTick(s.ResyncRate))
		t.ResyncMinRate = perTick(s.ResyncMinRate)
	}
	return t
}

// DecodeStored decodes a replicated volume's stored settings (config.json
// in its replication directory), either layout: durations, or the older
// one in ticks of tick_ms, read as the same times. It does not validate
// (the replication driver does when it loads them; doctor reports what it
// finds).
func DecodeStored(b []byte) (Settings, error) {
	var s Settings
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return s, err
	}
	legacy := false
	for _, k := range []string{"tick_ms", "ko_ticks", "al_retire_ticks", "ping_interval", "ping_timeout"} {
		if v, ok := keys[k]; ok && (k == "tick_ms" || k == "ko_ticks" || k == "al_retire_ticks" || (len(v) > 0 && v[0] != '"')) {
			legacy = true
		}
	}
	if !legacy {
		err := json.Unmarshal(b, &s)
		return s, err
	}
	// The layout before durations: times in ticks of tick_ms (100 by
	// default), zero meaning the default.
	var old struct {
		Settings
		TickMillis    int `json:"tick_ms"`
		PingInterval  int `json:"ping_interval"`
		PingTimeout   int `json:"ping_timeout"`
		KoTicks       int `json:"ko_ticks"`
		ALRetireTicks int `json:"al_retire_ticks"`
	}
	if err := json.Unmarshal(b, &old); err != nil {
		return s, err
	}
	s = old.Settings
	tick := 100 * time.Millisecond
	if old.TickMillis > 0 {
		tick = time.Duration(old.TickMillis) * time.Millisecond
	}
	s.Tick = Duration(tick) // the tick it ran with, not a derived one
	d := func(n int) Duration {
		if n <= 0 {
			return 0
		}
		return Duration(time.Duration(n) * tick)
	}
	s.PingInterval, s.PingTimeout, s.KoTimeout, s.ALRetire = d(old.PingInterval), d(old.PingTimeout), d(old.KoTicks), d(old.ALRetireTicks)
	return s, nil
}
