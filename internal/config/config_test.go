package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefault(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	l := c.Listeners()
	if len(l) != 2 || l[0] != "127.0.0.1:10809" || l[1] != "unix:vmsan-data/nbd.sock" {
		t.Fatalf("default listeners %v", l)
	}
	c.DataDir = "/srv/x"
	if l := c.Listeners(); l[1] != "unix:/srv/x/nbd.sock" {
		t.Fatalf("socket does not follow data dir: %v", l)
	}
}

func TestParseFull(t *testing.T) {
	c, err := Parse([]byte(`
data_dir: /var/lib/vmsan
listen: ["0.0.0.0:10809", "unix:/run/vmsan.sock"]
tls: {mode: optional, cert: /c.pem, key: /k.pem}
metrics_listen: 127.0.0.1:9109
log_level: debug
max_payload: 16M
engine: {workers: 2, max_merge: 512K, gather_delay: 100us}
volumes:
  - name: vm1
    size: 20G
    cache: none
    rotational: true
    engine: {workers: 8}
  - name: ro
    size: 1048576
    read_only: true
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/var/lib/vmsan" || len(c.Listen) != 2 || c.TLS.Mode != "optional" || c.MaxPayload != 16<<20 {
		t.Fatalf("%+v", c)
	}
	if c.Engine.Workers != 2 || c.Engine.MaxMerge != 512<<10 || time.Duration(c.Engine.GatherDelay) != 100*time.Microsecond || c.Engine.MaxQueue != 0 {
		t.Fatalf("engine %+v", c.Engine)
	}
	if len(c.Volumes) != 2 || c.Volumes[0].Size != 20<<30 || c.Volumes[0].Cache != "none" || !c.Volumes[0].Rotational || !c.Volumes[1].ReadOnly {
		t.Fatalf("volumes %+v", c.Volumes)
	}
	e := c.Volumes[0].Engine.Merge(c.Engine)
	if e.Workers != 8 || e.MaxMerge != 512<<10 {
		t.Fatalf("merged engine %+v", e)
	}
}

func TestParseEmptyIsDefault(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != DefaultDataDir || c.Engine.Workers != 0 {
		t.Fatalf("%+v", c)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{"data_dri: /x\n", `line 1: unknown key "data_dri" (did you mean "data_dir"?)`},
		{"listen: [\"nohost\"]\n", `listen "nohost"`},
		{"listen: [\"unix:\"]\n", "empty socket path"},
		{"tls: {mode: always}\n", "tls.mode"},
		{"tls: {mode: required}\n", "needs both cert and key"},
		{"log_level: chatty\n", "log_level"},
		{"volumes:\n  - name: ../x\n    size: 1G\n", "volumes[0].name"},
		{"volumes:\n  - name: a\n    size: 1G\n  - name: a\n    size: 1G\n", "declared twice"},
		{"volumes:\n  - name: a\n", "size: required"},
		{"volumes:\n  - name: a\n    size: 1001\n", "not a multiple"},
		{"volumes:\n  - name: a\n    size: 10Q\n", "line 3"},
		{"volumes:\n  - name: a\n    size: 1G\n    cache: sometimes\n", "cache"},
		{"volumes:\n  - name: a\n    size: 1G\n    colour: red\n", `line 4: unknown key "colour" in section "volumes"`},
		{"engine: {workers: -1}\n", "engine.workers"},
		{"engine: {gather_delay: 5s}\n", "gather_delay"},
		{"max_payload: 1\n", "max_payload"},
		{"inflight_budget: 16M\n", "inflight_budget"},
		{"max_payload: 64M\ninflight_budget: 48M\n", "inflight_budget"},
		{"max_connections: -1\n", "max_connections"},
		{"nbd: {max_pending_handshakes: -1}\n", "nbd.max_pending_handshakes"},
		{"nbd: {handshake_timeout: -1s}\n", "nbd.handshake_timeout"},
		{"iscsi: {max_sessions: 70000}\n", "iscsi.max_sessions"},
		{"metrics_listen: nope\n", "metrics_listen"},
		{"listen: 5\n", `line 1: "listen" must be a list`},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) error = %v; want it to contain %q", c.yaml, err, c.want)
		}
	}
}

func TestLoadRelativePaths(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "vmsan.yaml")
	os.WriteFile(p, []byte("data_dir: data\nlisten: [\"unix:s.sock\"]\n"), 0o644)
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataDir != filepath.Join(dir, "data") || c.Listen[0] != "unix:"+filepath.Join(dir, "s.sock") {
		t.Fatalf("%+v", c)
	}
	os.WriteFile(p, []byte("log_level: warn\n"), 0o644)
	if c, err = Load(p); err != nil || c.DataDir != DefaultDataDir {
		t.Fatalf("default data dir from file: %+v %v", c, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	c := Default()
	c.Volumes = []Volume{{Name: "a", Size: 10 << 30}}
	c.Engine = Engine{Workers: 3, MaxMerge: 2 << 20, GatherDelay: Duration(-1)}
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if back.Volumes[0].Size != 10<<30 || back.Engine != c.Engine {
		t.Fatalf("round trip: %+v\n%s", back, b)
	}
}

// TestExampleFile keeps docs/vmsan.example.yaml loadable.
func TestExampleFile(t *testing.T) {
	p := filepath.Join("..", "..", "docs", "vmsan.example.yaml")
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(filepath.Join("..", "..", "vmsan-data"))
	got, _ := filepath.Abs(c.DataDir)
	if got != abs || len(c.Volumes) != 3 || c.Volumes[1].Engine.Workers != 8 || c.MetricsListen != "127.0.0.1:9109" ||
		c.Volumes[2].Replication == nil || c.Volumes[2].Replication.Peer != "127.0.0.1:7790" {
		t.Fatalf("%+v", c)
	}
}

func TestDefaultInflightBudget(t *testing.T) {
	for _, c := range []struct {
		ram        uint64
		maxPayload Size
		want       Size
	}{
		{64 << 30, 32 << 20, 1 << 30},  // big host: 1 GiB
		{2 << 30, 32 << 20, 512 << 20}, // RAM/4
		{0, 32 << 20, 1 << 30},         // RAM unknown
		{64 << 20, 32 << 20, 32 << 20}, // tiny host: still one request
		{64 << 20, 64 << 20, 64 << 20}, // and one NBD max payload
	} {
		if got := DefaultInflightBudget(c.ram, c.maxPayload); got != c.want {
			t.Errorf("DefaultInflightBudget(%d, %d) = %d, want %d", c.ram, c.maxPayload, got, c.want)
		}
	}
	if _, err := Parse([]byte("inflight_budget: 256M\nmax_connections: 10\niscsi: {max_sessions: 5}\n")); err != nil {
		t.Errorf("valid limits refused: %v", err)
	}
	if c, err := Parse([]byte("nbd:\n  max_pending_handshakes: 16\n  handshake_timeout: 5s\n")); err != nil || c.MaxPendingHandshakes != 16 || c.HandshakeTimeout != Duration(5*time.Second) {
		t.Errorf("nbd.max_pending_handshakes, nbd.handshake_timeout: %+v, %v", c, err)
	}
	// Newer than the nbd: section: not read at the top level.
	if _, err := Parse([]byte("handshake_timeout: 5s\n")); err == nil {
		t.Error("top-level handshake_timeout accepted; it belongs under nbd:")
	}
}
