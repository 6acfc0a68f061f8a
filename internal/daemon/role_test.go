package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/host"
	"github.com/vmsan/vmsan/internal/iscsi/iscsifront"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/scsi"
)

// gatePlugin registers a fake actuator for the default volume with the
// role controller and holds every write at the device until gate closes
// (a command admitted under the old role that does not finish).
type gatePlugin struct {
	gate chan struct{}
	held chan struct{}
	act  *fakeActuator
}

func (p *gatePlugin) Start(d host.Host, _ func(string) (export.Device, error)) error {
	return d.Roles().Register(config.DefaultVolumeName, p.act)
}
func (p *gatePlugin) WrapDevice(_ string, dev export.Device) export.Device {
	return &gatedDevice{Device: dev, p: p}
}
func (p *gatePlugin) Stop() error { return nil }

type gatedDevice struct {
	export.Device
	p *gatePlugin
}

func (g *gatedDevice) Submit(r *export.Request) {
	if r.Op != export.OpWrite {
		g.Device.Submit(r)
		return
	}
	select {
	case g.p.held <- struct{}{}:
	default:
	}
	go func() { <-g.p.gate; g.Device.Submit(r) }()
}

type fakeActuator struct {
	mu    sync.Mutex
	r     VolumeRole
	calls int
}

func (f *fakeActuator) Role() VolumeRole {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.r
}
func (f *fakeActuator) set(r VolumeRole) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.r = r
	return nil
}
func (f *fakeActuator) Promote(bool) error { return f.set(RolePrimary) }
func (f *fakeActuator) Demote(bool) error  { return f.set(RoleSecondary) }

// TestRoleChangeDrainTimeoutALUA: the role controller as the daemon wires
// it, with a WRITE admitted as primary stuck at the device. A plain demote
// waits (the daemon's drainVolume -> the per-volume target's WaitAdmitted), is
// refused with "role unchanged", and the groups are back to the primary's
// states without the replica being asked; a forced demote goes ahead after
// the wait with a warning, and the groups become standby.
func TestRoleChangeDrainTimeoutALUA(t *testing.T) {
	p1 := freeLoopback(t)
	p := &gatePlugin{gate: make(chan struct{}), held: make(chan struct{}, 1), act: &fakeActuator{r: RolePrimary}}
	logs := &syncBuffer{}
	r := startOpts(t, t.TempDir(), func(c *config.Config) {
		c.ISCSI = config.ISCSI{
			Mode:        config.ISCSIModePerVolume,
			NodeName:    "a",
			Listen:      []config.ISCSIPortal{{Addr: p1, TPGT: 1, RelativePort: 1}},
			PeerPortals: []config.ISCSIPortal{{Addr: "127.0.0.2:3260", TPGT: 11, RelativePort: 11}},
			Targets:     []config.ISCSITarget{{Volume: config.DefaultVolumeName}},
			AllowAny:    true,
		}
	}, func(o *Options) {
		o.Plugins = []PluginFactory{func(config.Config, *slog.Logger) (Plugin, error) { return p, nil }}
		o.RoleDrainTimeout = 200 * time.Millisecond
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	var fe *iscsifront.FrontEnd
	for _, f := range r.d.frontEnds {
		if x, ok := f.(*iscsifront.FrontEnd); ok {
			fe = x
		}
	}
	tg := fe.Targets()[0].LUs.(*scsi.Target)
	n := &scsi.Nexus{InitiatorName: "iqn.x:i", InitiatorPort: "iqn.x:i,i,0x1", RelativePort: 1, PortGroup: 1}
	drainUA(t, tg, n)
	states := func(what string, own, peer string) {
		t.Helper()
		drainUA(t, tg, n)
		got := rtpg(t, tg, n)
		if got[1] != own+" ports=1," || got[11] != peer+" ports=11," {
			t.Fatalf("%s: RTPG %v, want own %s peer %s", what, got, own, peer)
		}
	}
	states("registered as primary", "state=0", "state=2")

	// WRITE(10) of one block, admitted as primary, held at the device.
	wdone := make(chan uint8, 1)
	tg.Execute(&scsi.Task{Nexus: n, CDB: []byte{0x2A, 0, 0, 0, 0, 0, 0, 0, 1, 0}, DataOut: make([]byte, 512), ExpectedOut: 512},
		func(res *scsi.Result) { wdone <- res.Status; res.Release() })
	select {
	case <-p.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never reached the device")
	}

	ctx := context.Background()
	got, err := pluginHost{r.d}.Roles().Change(ctx, role.Request{Volume: config.DefaultVolumeName, Op: role.Demote, By: "test"})
	if err == nil || !strings.Contains(err.Error(), "demote refused, role unchanged") || got != RolePrimary {
		t.Fatalf("plain demote with a write still running: %v %v", got, err)
	}
	if p.act.calls != 0 {
		t.Fatalf("the replica was asked to demote %d times after a failed drain", p.act.calls)
	}
	states("after the refused demote", "state=0", "state=2")
	if l := logs.String(); !strings.Contains(l, "role=changing was=primary") || !strings.Contains(l, "role=primary was=changing") {
		t.Fatalf("the front ends were not told changing and back:\n%s", l)
	}

	got, err = pluginHost{r.d}.Roles().Change(ctx, role.Request{Volume: config.DefaultVolumeName, Op: role.Demote, Force: true, By: "test"})
	if err != nil || got != RoleSecondary || p.act.Role() != RoleSecondary {
		t.Fatalf("forced demote: %v %v", got, err)
	}
	if l := logs.String(); !strings.Contains(l, "forced role change with commands still running") {
		t.Fatalf("no warning for the forced demote:\n%s", l)
	}
	states("after the forced demote", "state=2", "state=0")
	close(p.gate)
	select {
	case <-wdone:
	case <-time.After(10 * time.Second):
		t.Fatal("the held write never completed")
	}
}
