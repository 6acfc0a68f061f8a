package replset

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func d(s string) Duration { v, _ := time.ParseDuration(s); return Duration(v) }

// Durations become ticks: the tick is a tenth of the ping interval
// (10..100 ms, whole milliseconds) unless set, and every timeout rounds up.
func TestTicks(t *testing.T) {
	base := Settings{Listen: "a:1", Peer: "b:2"}
	// The defaults are the state machine's historical ones: 100 ms ticks,
	// ping 10, timeout 60, ko 100, AL retire 50.
	if got, want := base.Ticks(), (Ticks{Tick: 100 * time.Millisecond, PingInterval: 10, PingTimeout: 60, KoTicks: 100, ALRetireTicks: 50}); got != want {
		t.Fatalf("defaults: %+v, want %+v", got, want)
	}
	s := base
	s.PingInterval, s.PingTimeout, s.KoTimeout = d("150ms"), d("1s"), d("25ms")
	if tk := s.Ticks(); tk.Tick != 15*time.Millisecond || tk.PingInterval != 10 || tk.PingTimeout != 67 || tk.KoTicks != 2 || tk.ALRetireTicks != 334 {
		t.Fatalf("fast pings: %+v", tk)
	}
	s = base
	s.PingInterval, s.PingTimeout = d("20ms"), d("50ms")
	if tk := s.Ticks(); tk.Tick != 10*time.Millisecond || tk.PingInterval != 2 || tk.PingTimeout != 5 {
		t.Fatalf("tick floor: %+v", tk)
	}
	// An explicit tick wins; a sub-millisecond remainder is dropped.
	s = base
	s.Tick = d("20.5ms")
	if tk := s.Ticks(); tk.Tick != 20*time.Millisecond || tk.PingInterval != 50 {
		t.Fatalf("explicit tick: %+v", tk)
	}
	// Rates per tick, exact and without overflow.
	s = base
	s.ResyncRate, s.ResyncMinRate = 100<<20, 10<<20
	if tk := s.Ticks(); tk.ResyncRate != 10485760 || tk.ResyncMinRate != 1048576 {
		t.Fatalf("rates: %+v", tk)
	}
	s.ResyncRate, s.ResyncMinRate = 1<<62, 0
	if tk := s.Ticks(); tk.ResyncRate != (1<<62)/10 {
		t.Fatalf("huge rate: %d", tk.ResyncRate)
	}
	s.ResyncRate = 1
	if tk := s.Ticks(); tk.ResyncRate != 1 {
		t.Fatalf("a set rate is at least one byte per tick: %d", tk.ResyncRate)
	}
}

// Every problem at once, each with its configuration key.
func TestProblems(t *testing.T) {
	if p := (Settings{Listen: "a:1", Peer: "b:2"}).Problems(); p != nil {
		t.Fatalf("valid settings: %v", p)
	}
	s := Settings{Listen: "a:0", Peer: "a:0", Protocol: "D", Role: "master", Dial: "maybe", SplitBrain: "x",
		PingInterval: d("1s"), PingTimeout: d("1s"), KoTimeout: d("2h"), ResyncMinRate: 5, Tick: d("100us")}
	got := strings.Join(s.Problems(), "\n")
	for _, want := range []string{`listen "a:0": port "0"`, "must differ from listen", `protocol "D"`, `role "master"`,
		`dial "maybe"`, `split_brain_policy "x"`, "ping_timeout 1s", "ko_timeout 2h0m0s", "resync_min_rate 5", "tick 100µs"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	if err := (Settings{}).Validate(); err == nil || !strings.Contains(err.Error(), "listen: required") || !strings.Contains(err.Error(), "peer: required") {
		t.Errorf("empty settings: %v", err)
	}
}

func TestParsers(t *testing.T) {
	for in, want := range map[string]Protocol{"": ProtoC, "c": ProtoC, "A": ProtoA, "b": ProtoB} {
		if p, err := ParseProtocol(in); err != nil || p != want {
			t.Errorf("ParseProtocol(%q) = %v, %v", in, p, err)
		}
	}
	if _, err := ParseProtocol("D"); err == nil {
		t.Error("protocol D accepted")
	}
	for i, n := range sbNames {
		if p, err := ParseSplitBrainPolicy(n); err != nil || p != SplitBrainPolicy(i) || p.String() != n {
			t.Errorf("ParseSplitBrainPolicy(%q) = %v, %v", n, p, err)
		}
	}
	if _, err := ParseSplitBrainPolicy("discard-everything"); err == nil {
		t.Error("unknown policy accepted")
	}
}

// Durations are Go duration strings in JSON.
func TestDurationJSON(t *testing.T) {
	b, _ := json.Marshal(Settings{Listen: "a:1", Peer: "b:2", PingTimeout: d("1.5s")})
	if !strings.Contains(string(b), `"ping_timeout":"1.5s"`) || strings.Contains(string(b), "ko_timeout") {
		t.Fatalf("json: %s", b)
	}
	var s Settings
	if err := json.Unmarshal(b, &s); err != nil || s.PingTimeout != d("1.5s") {
		t.Fatalf("back: %+v %v", s, err)
	}
	if err := json.Unmarshal([]byte(`{"ping_timeout": "soon"}`), &s); err == nil {
		t.Fatal("bad duration accepted")
	}
}

// A secret is required unless insecure; it may come from a file (first
// line, trimmed) and is never part of a message.
func TestAuthSettings(t *testing.T) {
	base := Settings{Listen: "a:1", Peer: "b:2"}
	if err := base.AuthProblem(); !errors.Is(err, ErrNoSecret) || !strings.Contains(err.Error(), "shared_secret_file") || !strings.Contains(err.Error(), "insecure") {
		t.Fatalf("no secret: %v", err)
	}
	s := base
	s.Insecure = true
	if err := s.AuthProblem(); err != nil {
		t.Fatalf("insecure: %v", err)
	}
	if sec, err := s.Secret(); err != nil || sec != nil {
		t.Fatalf("insecure secret: %q %v", sec, err)
	}
	f := filepath.Join(t.TempDir(), "s")
	os.WriteFile(f, []byte("  a-secret-from-a-file \nsecond line\n"), 0o600)
	s = base
	s.SharedSecretFile = f
	if sec, err := s.Secret(); err != nil || string(sec) != "a-secret-from-a-file" || s.AuthProblem() != nil {
		t.Fatalf("from file: %q %v", sec, err)
	}
	os.WriteFile(f, []byte("short-one\n"), 0o600)
	if _, err := s.Secret(); err == nil || strings.Contains(err.Error(), "short-one") {
		t.Fatalf("short secret in a file: %v", err)
	}
	s = base
	s.SharedSecret, s.AcceptFrom = "inline-secret-16b", []string{"10.0.0.1", "10.0.0.0/8", "::1", "nope"}
	p := strings.Join(s.Problems(), "\n")
	if !strings.Contains(p, `accept_from "nope"`) || strings.Count(p, "accept_from") != 1 {
		t.Fatalf("accept_from problems: %s", p)
	}
}
