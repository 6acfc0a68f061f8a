package driver

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmsan/vmsan/internal/atomicfile"
	"github.com/vmsan/vmsan/internal/repl"
)

// Settings are a replicated volume's configuration, stored as
// <data_dir>/repl/<volume>/config.json (written by `vmsan repl configure`).
type Settings struct {
	// Listen is this node's replication address for the volume, Peer the
	// other node's. The node whose Listen sorts lower dials; the other only
	// accepts, so the two never race to build two connections.
	Listen string `json:"listen"`
	Peer   string `json:"peer"`
	// Protocol "A", "B" or "C" (default).
	Protocol string `json:"protocol,omitempty"`
	// Role at the very first start ("primary" or "secondary"); afterwards
	// the persisted role wins (change it with promote/demote).
	Role string `json:"role,omitempty"`
	// SplitBrain policy: disconnect (default), discard-zero-changes,
	// discard-younger-primary, discard-least-changes.
	SplitBrain string `json:"split_brain,omitempty"`
	// Dial: "auto" (default: the lower Listen dials), "yes" or "no". Set
	// explicitly when the peer address is a proxy or NAT address.
	Dial string `json:"dial,omitempty"`
	// NodeID identifies this node (random, chosen by configure).
	NodeID uint64 `json:"node_id"`

	TickMillis   int `json:"tick_ms,omitempty"`       // default 100
	PingInterval int `json:"ping_interval,omitempty"` // ticks, default 10
	PingTimeout  int `json:"ping_timeout,omitempty"`  // ticks, default 60
	KoTicks      int `json:"ko_ticks,omitempty"`      // ticks, default 100
	// ALRetireTicks: activity-log extents idle this long are retired.
	ALRetireTicks int `json:"al_retire_ticks,omitempty"` // ticks, default 50
	// ResyncRate in bytes per second (0: unlimited); with ResyncMinRate the
	// dynamic controller gives resync what application writes leave.
	ResyncRate    int64 `json:"resync_rate,omitempty"`
	ResyncMinRate int64 `json:"resync_min_rate,omitempty"`
	Checksum      bool  `json:"checksum_resync,omitempty"`
}

// Dir is where a volume's replication files live.
func Dir(dataDir, volume string) string { return filepath.Join(dataDir, "repl", volume) }

// LoadSettings reads config.json; os.ErrNotExist means "not replicated".
func LoadSettings(dir string) (Settings, error) {
	var s Settings
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", dir, err)
	}
	return s, s.Validate()
}

// Validate checks the settings.
func (s Settings) Validate() error {
	if s.Listen == "" || s.Peer == "" {
		return errors.New("repl: listen and peer addresses are required")
	}
	if s.Listen == s.Peer {
		return errors.New("repl: listen and peer must differ")
	}
	if _, err := repl.ParseProtocol(s.Protocol); err != nil {
		return err
	}
	if _, err := repl.ParseSplitBrainPolicy(s.SplitBrain); err != nil {
		return err
	}
	switch s.Role {
	case "", "primary", "secondary":
	default:
		return fmt.Errorf("repl: role %q (want primary or secondary)", s.Role)
	}
	switch s.Dial {
	case "", "auto", "yes", "no":
	default:
		return fmt.Errorf("repl: dial %q (want auto, yes or no)", s.Dial)
	}
	if s.NodeID == 0 {
		return errors.New("repl: node_id must be set")
	}
	return nil
}

// SaveSettings writes config.json atomically.
func SaveSettings(dir string, s Settings) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	return atomicfile.WriteFile(filepath.Join(dir, "config.json"), append(b, '\n'), 0o644)
}

// state is the persisted replication state: meta.json, al.json and
// bitmap.bin, each replaced atomically (temp, fsync, rename, fsync dir).
type state struct{ dir string }

func (s state) load() (m repl.Meta, words []uint64, al []int64, found bool, err error) {
	b, err := os.ReadFile(filepath.Join(s.dir, "meta.json"))
	if errors.Is(err, os.ErrNotExist) {
		return m, nil, nil, false, nil
	}
	if err != nil {
		return m, nil, nil, false, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, nil, nil, false, fmt.Errorf("meta.json: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(s.dir, "al.json")); err == nil {
		if err := json.Unmarshal(b, &al); err != nil {
			return m, nil, nil, false, fmt.Errorf("al.json: %w", err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(s.dir, "bitmap.bin")); err == nil {
		if len(b)%8 != 0 {
			return m, nil, nil, false, errors.New("bitmap.bin: length not a multiple of 8")
		}
		words = make([]uint64, len(b)/8)
		for i := range words {
			words[i] = binary.LittleEndian.Uint64(b[i*8:])
		}
	}
	return m, words, al, true, nil
}

// persist writes what p says changed. Order matters for crash safety: the
// bitmap before the AL (an AL that drops an extent must never be on disk
// without the bitmap covering that extent's dirty chunks), and meta last.
func (s state) persist(p repl.Persist) error {
	if p.BitmapChanged {
		b := make([]byte, 8*len(p.Bitmap))
		for i, w := range p.Bitmap {
			binary.LittleEndian.PutUint64(b[i*8:], w)
		}
		if err := atomicfile.WriteFile(filepath.Join(s.dir, "bitmap.bin"), b, 0o644); err != nil {
			return err
		}
	}
	if p.ALChanged {
		al := p.AL
		if al == nil {
			al = []int64{}
		}
		b, _ := json.Marshal(al)
		if err := atomicfile.WriteFile(filepath.Join(s.dir, "al.json"), b, 0o644); err != nil {
			return err
		}
	}
	if p.Meta != nil {
		b, _ := json.MarshalIndent(p.Meta, "", "  ")
		if err := atomicfile.WriteFile(filepath.Join(s.dir, "meta.json"), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}
