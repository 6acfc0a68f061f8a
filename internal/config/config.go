// Package config is vmsan's configuration: a YAML file, defaults for
// everything, and validation with clear errors.
//
// Simplest use:
//
//	cfg := config.Default()                // what `vmsan serve` does with no file
//	cfg, err := config.Load("vmsan.yaml")  // defaults, overlaid by the file
//	// ... apply command-line flags to cfg fields ...
//	err = cfg.Validate()
//
// Example file (every key is optional; unknown keys and values of the
// wrong kind are errors in the file's words, with the line and a "did you
// mean" for a typo: see yamlerr.go):
//
//	data_dir: /var/lib/vmsan
//	listen: ["0.0.0.0:10809", "unix:/run/vmsan/nbd.sock"]
//	tls: {mode: required, cert: /etc/vmsan/server.pem, key: /etc/vmsan/server.key}
//	metrics_listen: 127.0.0.1:9109
//	log_level: info
//	engine: {workers: 4, max_merge: 1M}
//	volumes:
//	  - name: vm1
//	    size: 20G
//	    cache: none
//	    rotational: true
//	    engine: {workers: 8}
//	    replication: {listen: 10.0.0.1:7789, peer: 10.0.0.2:7789, role: primary, shared_secret_file: /etc/vmsan/repl.secret}
//
// Sizes take units as described at volume.ParseSize (G = GiB).
//
// Concurrency: a Config is a plain value; do not mutate it while another
// goroutine reads it.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/replset"
	"github.com/vmsan/vmsan/internal/volume"
)

// Defaults of the embedded configuration (`vmsan serve` with no arguments).
const (
	DefaultDataDir    = "./vmsan-data"
	DefaultListen     = "127.0.0.1:10809"
	DefaultVolumeName = "default"
	DefaultVolumeSize = 10 << 30
	// DefaultMaxPayload is the NBD spec's 32 MiB, which every client
	// accepts without negotiation. It repeats nbd/proto's
	// DefaultMaxPayload so that config imports no front end; a test on
	// the NBD side (nbd/proto) asserts the two are equal.
	DefaultMaxPayload = 32 << 20
)

// Size is a byte count that unmarshals from "20G" style strings or plain
// integers.
type Size int64

// UnmarshalYAML accepts an integer or a string with a unit.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: size must be a number or a string like 20G", n.Line)
	}
	v, err := volume.ParseSize(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*s = Size(v)
	return nil
}

// MarshalYAML writes the size with a unit where exact.
func (s Size) MarshalYAML() (any, error) { return volume.FormatSize(int64(s)), nil }

// Duration unmarshals from Go duration strings ("200us", "1ms").
type Duration time.Duration

// UnmarshalYAML parses a time.ParseDuration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as a string.
func (d Duration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// TLS configures TLS on NBD listeners. Mode "off" (default), "optional"
// (clients may STARTTLS) or "required" (every option but STARTTLS/ABORT is
// refused before TLS).
type TLS struct {
	Mode string `yaml:"mode,omitempty"`
	Cert string `yaml:"cert,omitempty"`
	Key  string `yaml:"key,omitempty"`
	// CA, if set, makes the server require and verify client certificates.
	CA string `yaml:"ca,omitempty"`
}

// Engine holds I/O engine tuning (see ioengine.Config). Zero fields inherit:
// a volume's from the top-level engine section, the top level's from the
// engine's built-in defaults. A negative gather_delay disables write
// gathering.
type Engine struct {
	Workers     int      `yaml:"workers,omitempty"`
	MaxMerge    Size     `yaml:"max_merge,omitempty"`
	MaxQueue    int      `yaml:"max_queue,omitempty"`
	GatherDelay Duration `yaml:"gather_delay,omitempty"`
}

// Merge returns e with zero fields taken from parent.
func (e Engine) Merge(parent Engine) Engine {
	if e.Workers == 0 {
		e.Workers = parent.Workers
	}
	if e.MaxMerge == 0 {
		e.MaxMerge = parent.MaxMerge
	}
	if e.MaxQueue == 0 {
		e.MaxQueue = parent.MaxQueue
	}
	if e.GatherDelay == 0 {
		e.GatherDelay = parent.GatherDelay
	}
	return e
}

// Volume declares a volume the daemon ensures exists at start. For a volume
// that already exists, a larger Size grows it (a smaller one is only
// warned about), and Rotational, ReadOnly, and Cache/Description when set,
// replace the values in its metadata. Block size is fixed at creation.
type Volume struct {
	Name        string `yaml:"name"`
	Size        Size   `yaml:"size"`
	Cache       string `yaml:"cache,omitempty"`
	Rotational  bool   `yaml:"rotational,omitempty"`
	ReadOnly    bool   `yaml:"read_only,omitempty"`
	Description string `yaml:"description,omitempty"`
	BlockSize   uint32 `yaml:"block_size,omitempty"` // logical block size
	Engine      Engine `yaml:"engine,omitempty"`
	// Replication, when set, replicates the volume to a peer vmsan node
	// (see docs/replication.md). Applied at daemon start.
	Replication *Replication `yaml:"replication,omitempty"`
}

// Replication configures a volume's replication to one peer node: the
// configuration file's form of replset.Settings (sizes and durations as
// this file writes them; Settings converts). Listen and Peer are
// required; everything else has the defaults shown (replset.Defaults).
//
//	replication:
//	  listen: 10.0.0.1:7789         # this node's replication address
//	  peer: 10.0.0.2:7789           # the other node's
//	  role: primary                 # role at the very first start (default secondary)
//	  protocol: C                   # A, B or C
//	  ping_interval: 1s
//	  ping_timeout: 6s              # silence before the peer is declared dead
//	  ko_timeout: 10s               # a replicated write unacknowledged this long drops the peer
//	  resync_rate: 100M             # bytes per second (0: unlimited)
//	  split_brain_policy: disconnect
//	  shared_secret_file: /etc/vmsan/repl.secret  # required: the same secret on both nodes
//	  # shared_secret: "..."        # or inline (at least 16 bytes); never printed
//	  # insecure: true              # instead of a secret: accept unauthenticated peers
//	  # accept_from: [10.0.0.0/24]  # addresses the peer connects from (default: the peer's host)
type Replication struct {
	Listen   string `yaml:"listen"`
	Peer     string `yaml:"peer"`
	Role     string `yaml:"role,omitempty"`
	Protocol string `yaml:"protocol,omitempty"`
	// Dial: auto (the lower listen address dials), yes or no; set it when
	// peer is a proxy or NAT address.
	Dial          string   `yaml:"dial,omitempty"`
	PingInterval  Duration `yaml:"ping_interval,omitempty"`
	PingTimeout   Duration `yaml:"ping_timeout,omitempty"`
	KoTimeout     Duration `yaml:"ko_timeout,omitempty"`
	ResyncRate    Size     `yaml:"resync_rate,omitempty"`
	ResyncMinRate Size     `yaml:"resync_min_rate,omitempty"`
	SplitBrain    string   `yaml:"split_brain_policy,omitempty"`
	Checksum      bool     `yaml:"checksum_resync,omitempty"`
	// SharedSecret or SharedSecretFile (relative to the config file)
	// authenticates the peer on every replication connection; one is
	// required unless Insecure (replset.Settings.AuthProblem).
	SharedSecret     string   `yaml:"shared_secret,omitempty"`
	SharedSecretFile string   `yaml:"shared_secret_file,omitempty"`
	Insecure         bool     `yaml:"insecure,omitempty"`
	AcceptFrom       []string `yaml:"accept_from,omitempty"`
}

// MarshalYAML hides the inline secret (`serve --print-config`).
func (r Replication) MarshalYAML() (any, error) {
	type plain Replication
	p := plain(r)
	if p.SharedSecret != "" {
		p.SharedSecret = Masked
	}
	return p, nil
}

// Settings converts the section to the replication settings type (the
// protocol name upper-cased); zero fields stay zero and mean replset's
// defaults (replset.Defaults: one set of them).
func (r Replication) Settings() replset.Settings {
	return replset.Settings{
		Listen: r.Listen, Peer: r.Peer, Role: r.Role, Protocol: strings.ToUpper(r.Protocol),
		Dial: r.Dial, SplitBrain: r.SplitBrain,
		PingInterval:  replset.Duration(r.PingInterval),
		PingTimeout:   replset.Duration(r.PingTimeout),
		KoTimeout:     replset.Duration(r.KoTimeout),
		ResyncRate:    int64(r.ResyncRate),
		ResyncMinRate: int64(r.ResyncMinRate),
		Checksum:      r.Checksum,

		SharedSecret: r.SharedSecret, SharedSecretFile: r.SharedSecretFile,
		Insecure: r.Insecure, AcceptFrom: r.AcceptFrom,
	}
}

// validate returns one message per problem, each prefixed with where
// (replset.Settings.Problems has the rules).
func (r Replication) validate(where string) []string {
	var errs []string
	for _, p := range r.Settings().Problems() {
		errs = append(errs, where+"."+p)
	}
	if err := r.Settings().AuthProblem(); err != nil {
		errs = append(errs, where+".shared_secret_file: "+err.Error())
	}
	return errs
}

// Config is the whole daemon configuration.
//
// Listen, TLS, MaxPayload and MaxConnections are the NBD front end's: a
// file sets them under nbd: (NBD); at the top level they are still read
// (deprecated, see Deprecated), and after decoding they are here.
type Config struct {
	DataDir       string   `yaml:"data_dir,omitempty"`
	Listen        []string `yaml:"listen,omitempty"`
	TLS           TLS      `yaml:"tls,omitempty"`
	MetricsListen string   `yaml:"metrics_listen,omitempty"`
	Pprof         bool     `yaml:"pprof,omitempty"`
	LogLevel      string   `yaml:"log_level,omitempty"`
	MaxPayload    Size     `yaml:"max_payload,omitempty"`
	// InflightBudget bounds the request payload bytes the daemon holds in
	// flight over all clients of all front ends (0: 1 GiB or a quarter of
	// RAM, whichever is smaller; see DefaultInflightBudget).
	InflightBudget Size `yaml:"inflight_budget,omitempty"`
	// MaxConnections bounds open NBD connections (0: 1024).
	MaxConnections int `yaml:"max_connections,omitempty"`
	// MaxPendingHandshakes bounds NBD connections still in the handshake
	// (0: 64), at most an eighth of the file descriptor limit; past it the
	// oldest is closed. Set as nbd.max_pending_handshakes only (the key
	// is newer than the nbd: section).
	MaxPendingHandshakes int `yaml:"-"`
	// HandshakeTimeout closes an NBD connection that has not completed
	// its handshake in time (0: 30s); nbd.handshake_timeout only.
	HandshakeTimeout Duration `yaml:"-"`
	Engine           Engine   `yaml:"engine,omitempty"`
	Volumes          []Volume `yaml:"volumes,omitempty"`
	// NoDefaultVolume stops the daemon from creating the 10 GiB "default"
	// volume in an empty data directory.
	NoDefaultVolume bool `yaml:"no_default_volume,omitempty"`
	// NBD is the nbd: section as read; decoding moves it into Listen,
	// TLS, MaxPayload and MaxConnections and leaves it empty (nbd.go).
	NBD NBD `yaml:"nbd,omitempty"`
	// ISCSI configures the iSCSI front end (iscsi.go); off by default.
	ISCSI ISCSI `yaml:"iscsi,omitempty"`
	// Deprecated names the deprecated top-level keys the file used
	// ("listen", "tls", "max_payload", "max_connections"; DeprecationNotes).
	Deprecated []string `yaml:"-"`
}

// Default returns the embedded configuration. Listen is empty here: the
// daemon fills in DefaultListen and unix:<data_dir>/nbd.sock when no
// listener is configured, so that the socket follows --data-dir.
func Default() Config {
	return Config{
		DataDir:    DefaultDataDir,
		LogLevel:   "info",
		MaxPayload: DefaultMaxPayload,
		TLS:        TLS{Mode: "off"},
		// Engine left zero: the I/O engine's own defaults apply (see
		// ioengine.Config), so they are defined in one place.
	}
}

// MinInflightBudget is the smallest inflight_budget: the largest iSCSI
// transfer, so that one command always fits.
const MinInflightBudget Size = 32 << 20

// DefaultInflightBudget is the inflight_budget used when none is set: 1 GiB
// or a quarter of RAM (ram, bytes; 0 if unknown), whichever is smaller,
// never below MinInflightBudget or max_payload.
func DefaultInflightBudget(ram uint64, maxPayload Size) Size {
	b := Size(1 << 30)
	if q := Size(ram / 4); ram > 0 && q < b {
		b = q
	}
	return max(b, MinInflightBudget, maxPayload)
}

// maxConfigBytes bounds the config file read.
const maxConfigBytes = 4 << 20

// Load reads a YAML file over Default(). Unknown keys are errors.
func Load(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	if len(b) > maxConfigBytes {
		return Config{}, fmt.Errorf("config %s: larger than %d bytes", path, maxConfigBytes)
	}
	cfg, err := decode(b)
	if fe, ok := err.(*FileErrors); ok {
		fe.File = path // "vmsan.yaml:12: unknown key ..."
		return Config{}, fe
	}
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	// Relative paths in a file are relative to the file, not to the cwd of
	// whoever starts the daemon.
	base := filepath.Dir(path)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(base, p)
	}
	if cfg.DataDir == "" {
		cfg.DataDir = DefaultDataDir
	} else {
		cfg.DataDir = rel(cfg.DataDir)
	}
	for i, l := range cfg.Listen {
		if p, ok := strings.CutPrefix(l, "unix:"); ok {
			cfg.Listen[i] = "unix:" + rel(p)
		}
	}
	cfg.TLS.Cert, cfg.TLS.Key, cfg.TLS.CA = rel(cfg.TLS.Cert), rel(cfg.TLS.Key), rel(cfg.TLS.CA)
	cfg.ISCSI.resolvePaths(rel)
	for _, v := range cfg.Volumes {
		if v.Replication != nil && v.Replication.SharedSecretFile != "" {
			v.Replication.SharedSecretFile = rel(v.Replication.SharedSecretFile)
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes YAML over Default() and validates the result.
func Parse(b []byte) (Config, error) {
	cfg, err := decode(b)
	if err != nil {
		return Config{}, err
	}
	if cfg.DataDir == "" {
		cfg.DataDir = DefaultDataDir
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// decode overlays b on Default() with DataDir left empty when the file does
// not set it (so Load can tell "set in file" from "default").
func decode(b []byte) (Config, error) {
	cfg := Default()
	cfg.DataDir = ""
	// Unknown keys and values of the wrong kind, in the file's words
	// (yamlerr.go); the decoder's own messages name Go types.
	if err := checkYAML(b); err != nil {
		return Config{}, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true) // a typo in a key must not be silently ignored
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, err
	}
	if err := cfg.foldNBD(topLevelKeys(b)); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate checks every field and returns all problems found, one per line.
func (c *Config) Validate() error {
	var errs []string
	add := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	if c.DataDir == "" {
		add("data_dir: must not be empty")
	}
	for _, l := range c.Listen {
		if err := ValidateListen(l); err != nil {
			add("listen %q: %v", l, err)
		}
	}
	switch c.TLS.Mode {
	case "", "off":
		if c.TLS.Cert != "" || c.TLS.Key != "" {
			// Certificates given without a mode: the user clearly wants TLS.
			add("tls: cert/key given but mode is off; set mode: optional or required")
		}
	case "optional", "required":
		if c.TLS.Cert == "" || c.TLS.Key == "" {
			add("tls: mode %s needs both cert and key", c.TLS.Mode)
		}
	default:
		add("tls.mode %q: want off, optional or required", c.TLS.Mode)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			add("metrics_listen %q: %v", c.MetricsListen, err)
		}
	}
	switch c.LogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		add("log_level %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.MaxPayload != 0 && (c.MaxPayload < 4096 || c.MaxPayload > 1<<30) {
		add("max_payload %d: want between 4K and 1G", c.MaxPayload)
	}
	// One request must always fit: the largest NBD payload and the
	// largest iSCSI transfer (32 MiB).
	if minB := max(c.MaxPayload, MinInflightBudget); c.InflightBudget != 0 && c.InflightBudget < minB {
		add("inflight_budget %d: want at least %d (32M and max_payload)", c.InflightBudget, minB)
	}
	if c.MaxConnections < 0 || c.MaxConnections > 1<<20 {
		add("max_connections %d: want 1..1048576 (0: default 1024)", c.MaxConnections)
	}
	if c.MaxPendingHandshakes < 0 || c.MaxPendingHandshakes > 65535 {
		add("nbd.max_pending_handshakes %d: want 1..65535 (0: default 64)", c.MaxPendingHandshakes)
	}
	if c.HandshakeTimeout < 0 {
		add("nbd.handshake_timeout %v: want a positive duration (0: default 30s)", time.Duration(c.HandshakeTimeout))
	}
	validateEngine := func(where string, e Engine) {
		if e.Workers < 0 || e.Workers > 1024 {
			add("%sengine.workers %d: want 1..1024", where, e.Workers)
		}
		if e.MaxMerge < 0 || e.MaxMerge > 64<<20 {
			add("%sengine.max_merge %d: want at most 64M", where, e.MaxMerge)
		}
		if e.MaxQueue < 0 || e.MaxQueue > 1<<20 {
			add("%sengine.max_queue %d: want at most 1048576", where, e.MaxQueue)
		}
		if time.Duration(e.GatherDelay) > time.Second {
			add("%sengine.gather_delay %v: want at most 1s (negative disables gathering)", where, time.Duration(e.GatherDelay))
		}
	}
	validateEngine("", c.Engine)
	seen := map[string]bool{}
	for i, v := range c.Volumes {
		where := fmt.Sprintf("volumes[%d]", i)
		if err := volume.ValidateName(v.Name); err != nil {
			add("%s.name: %v", where, err)
		} else if seen[v.Name] {
			add("%s.name %q: declared twice", where, v.Name)
		}
		seen[v.Name] = true
		if v.Size <= 0 {
			add("%s (%s).size: required and must be > 0", where, v.Name)
		}
		bs := v.BlockSize
		if bs == 0 {
			bs = volume.DefaultLogicalBlockSize
		}
		if bs < 512 || bs > 64<<10 || bs&(bs-1) != 0 {
			add("%s (%s).block_size %d: want a power of two in [512, 65536]", where, v.Name, v.BlockSize)
		} else if v.Size > 0 && int64(v.Size)%int64(bs) != 0 {
			add("%s (%s).size %d: not a multiple of the block size %d", where, v.Name, v.Size, bs)
		}
		if m, err := backend.ParseCacheMode(v.Cache); err != nil {
			add("%s (%s).cache: %v", where, v.Name, err)
		} else if v.Cache != "" {
			// Store the canonical spelling ("WriteBack" -> "writeback") so
			// that comparisons with a volume's metadata see no change.
			c.Volumes[i].Cache = string(m)
		}
		validateEngine(where+".", v.Engine)
		if v.Replication != nil {
			errs = append(errs, v.Replication.validate(fmt.Sprintf("%s (%s).replication", where, v.Name))...)
		}
	}
	// Replicated volumes may share a listen address: the node then has one
	// replication listener for them, the channel hello naming the volume
	// (repl/driver/mux.go).
	errs = append(errs, c.ISCSI.validate()...)
	if len(errs) > 0 {
		return errors.New("invalid configuration:\n  " + strings.Join(errs, "\n  "))
	}
	return nil
}

// ValidateListen checks one listener address: "host:port" (TCP) or
// "unix:/path" (Unix socket).
func ValidateListen(l string) error {
	if p, ok := strings.CutPrefix(l, "unix:"); ok {
		if p == "" {
			return errors.New("empty socket path")
		}
		// Longer than sun_path (107) is allowed: the daemon binds it via a
		// /proc/self/fd alias, though most NBD clients cannot connect to it.
		if len(p) > 4095 {
			return fmt.Errorf("socket path is %d bytes, longer than PATH_MAX", len(p))
		}
		return nil
	}
	host, port, err := net.SplitHostPort(l)
	if err != nil {
		return fmt.Errorf("want HOST:PORT or unix:PATH: %v", err)
	}
	_ = host
	if port == "" {
		return errors.New("missing port")
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("bad port: %v", err)
	}
	return nil
}

// Listeners returns the listeners to open: the configured ones, or the
// defaults (127.0.0.1:10809 and unix:<data_dir>/nbd.sock) when none is set.
func (c *Config) Listeners() []string {
	if len(c.Listen) > 0 {
		return c.Listen
	}
	return []string{DefaultListen, "unix:" + filepath.Join(c.DataDir, "nbd.sock")}
}

// Marshal renders the configuration as YAML (for `vmsan serve --print-config`).
func (c *Config) Marshal() ([]byte, error) { return yaml.Marshal(c) }
