package driver

import (
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
)

// Durations from the config file become ticks: the tick is a tenth of the
// ping interval (10..100 ms) and every timeout rounds up.
func TestSettingsFromConfig(t *testing.T) {
	d := func(s string) config.Duration { v, _ := time.ParseDuration(s); return config.Duration(v) }
	s := SettingsFromConfig(config.Replication{Listen: "a:1", Peer: "b:2", Protocol: "b",
		PingInterval: d("1s"), PingTimeout: d("6s"), KoTimeout: d("10s"), ResyncRate: 100 << 20})
	want := Settings{Listen: "a:1", Peer: "b:2", Protocol: "B", Role: "secondary", SplitBrain: "disconnect", Dial: "auto",
		TickMillis: 100, PingInterval: 10, PingTimeout: 60, KoTicks: 100, ALRetireTicks: 50, ResyncRate: 100 << 20}
	if s != want {
		t.Fatalf("got  %+v\nwant %+v", s, want)
	}
	s = SettingsFromConfig(config.Replication{Listen: "a:1", Peer: "b:2", PingInterval: d("150ms"), PingTimeout: d("1s"), KoTimeout: d("25ms")})
	if s.TickMillis != 15 || s.PingInterval != 10 || s.PingTimeout != 67 || s.KoTicks != 2 || s.ALRetireTicks != 334 {
		t.Fatalf("fast pings: %+v", s)
	}
	s = SettingsFromConfig(config.Replication{Listen: "a:1", Peer: "b:2", PingInterval: d("20ms"), PingTimeout: d("50ms")})
	if s.TickMillis != 10 || s.PingInterval != 2 || s.PingTimeout != 5 {
		t.Fatalf("tick floor: %+v", s)
	}
	s.NodeID = 1
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
}
