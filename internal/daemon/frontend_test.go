package daemon

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/host"
	"github.com/vmsan/vmsan/internal/nbd/client"
)

// TestStatusListsClients: status reports each connected client per volume
// (front end, address, since when), front-end neutrally, including a
// client that asked for the default export by the empty name.
func TestStatusListsClients(t *testing.T) {
	r := start(t, t.TempDir(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c1, err := client.Dial(ctx, r.url("default"), &client.Options{Connections: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := client.Dial(ctx, "nbd://"+r.tcp()+"/", &client.Options{Connections: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	// The server records a session once the handshake is over, which the
	// client sees slightly before the server goroutine does: poll.
	var st Status
	for deadline := time.Now().Add(10 * time.Second); ; {
		st = r.d.status()
		if len(st.Volumes) == 1 && len(st.Volumes[0].Clients) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("clients never listed: %+v", st.Volumes)
		}
		time.Sleep(10 * time.Millisecond)
	}
	v := st.Volumes[0]
	if v.Connections != 2 {
		t.Errorf("connections = %d, want 2", v.Connections)
	}
	for _, c := range v.Clients {
		if c.FrontEnd != "nbd" || c.Volume != "default" || !strings.HasPrefix(c.Remote, "127.0.0.1:") || c.Since.IsZero() {
			t.Errorf("client %+v", c)
		}
	}
	if len(st.FrontEnds) != 1 || st.FrontEnds[0].Name != "nbd" || st.FrontEnds[0].Active != 2 || len(st.FrontEnds[0].Listeners) != 2 {
		t.Errorf("front ends %+v", st.FrontEnds)
	}
	if st.Server == nil {
		t.Error("status lost the NBD server section existing readers use")
	}
	b, _ := json.Marshal(st)
	if !strings.Contains(string(b), `"clients":[{"front_end":"nbd"`) {
		t.Errorf("JSON lacks the client list: %s", b)
	}
	// cmd/vmsan's TestPrintStatusClients checks the text rendering.
}

// countingPlugin wraps every device it is asked to; it proves plugins come
// from Options (no global registration).
type countingPlugin struct{ wrapped int }

func (p *countingPlugin) Start(host.Host, func(string) (export.Device, error)) error { return nil }
func (p *countingPlugin) WrapDevice(_ string, dev export.Device) export.Device {
	p.wrapped++
	return dev
}
func (p *countingPlugin) Stop() error { return nil }

func TestPluginsFromOptions(t *testing.T) {
	dir := t.TempDir()
	cfg := config.Default()
	cfg.DataDir = dir
	cfg.Listen = []string{"127.0.0.1:0"}
	p := &countingPlugin{}
	d, err := New(cfg, Options{
		Logger:  slog.New(slog.DiscardHandler),
		Plugins: []PluginFactory{func(config.Config, *slog.Logger) (Plugin, error) { return p, nil }},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown()
	dev, err := registry{d}.Open("")
	if err != nil {
		t.Fatal(err)
	}
	dev.Release()
	if p.wrapped != 1 {
		t.Fatalf("plugin wrapped %d devices, want 1", p.wrapped)
	}
	// A second daemon without plugins gets none.
	d.Shutdown()
	d2, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Shutdown()
	if len(d2.plugins) != 0 {
		t.Fatalf("daemon without plugins has %d", len(d2.plugins))
	}
}
