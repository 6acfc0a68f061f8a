package scsi

import (
	"errors"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/export/exporttest"
)

// heldWrites holds every write until release is closed, as a replicated
// device waiting for its peer would.
type heldWrites struct {
	export.Device
	started chan struct{}
	release chan struct{}
}

func (d *heldWrites) Submit(r *export.Request) {
	if r.Op == export.OpWrite {
		d.started <- struct{}{}
		go func() { <-d.release; d.Device.Submit(r) }()
		return
	}
	d.Device.Submit(r)
}

// newHeldTarget is a target with one LU on a memory device whose writes
// wait for dev.release.
func newHeldTarget(t *testing.T, ports func() []Port) (*heldWrites, *Target) {
	mem := exporttest.NewMemDevice(t, "vol", testSize)
	dev := &heldWrites{Device: mem, started: make(chan struct{}, 4), release: make(chan struct{})}
	dir := t.TempDir()
	tg := New(Config{
		Registry: exporttest.NewRegistry(dev),
		LUNs:     func() []LUN { return []LUN{{Number: 0, Volume: "vol"}} },
		StateDir: func(string) (string, error) { return dir, nil },
		Ports:    ports,
	})
	t.Cleanup(tg.Close)
	return dev, tg
}

// TestWaitAdmittedSwitchOver is a planned switch-over's first step: the
// node's group goes transitioning; a write admitted before completes GOOD
// (not DATA PROTECT) and WaitAdmitted returns only after it, while a new
// write is refused with 04/0A (the initiator retries it).
func TestWaitAdmittedSwitchOver(t *testing.T) {
	dev, tg := newHeldTarget(t, func() []Port { return []Port{{Relative: 1, Group: 1}, {Relative: 2, Group: 2}} })
	n := &Nexus{InitiatorName: "iqn.a", InitiatorPort: "iqn.a,i,0x1", TargetName: "iqn.t", RelativePort: 1, PortGroup: 1}
	tg.SetPortGroupState(2, ALUAStandby) // the peer's paths, as on a primary
	tur := []byte{opTestUnitReady, 0, 0, 0, 0, 0}
	for i := 0; i < 4 && execOn(t, tg, n, 0, tur, nil, 0).status != StatusGood; i++ {
	}

	first := make(chan res, 1)
	tg.Execute(&Task{Nexus: n, CDB: cdb10(opWrite10, 0, 8, 1), DataOut: pattern(512, 7), ExpectedOut: 512}, func(r *Result) {
		first <- res{status: r.Status, sense: append([]byte(nil), r.Sense...)}
		r.Release()
	})
	<-dev.started // admitted, now at the device
	if n := tg.Admitted(); n != 1 {
		t.Fatalf("admitted %d, want 1", n)
	}
	tg.SetPortGroupState(1, ALUATransitioning)
	waited := make(chan error, 1)
	go func() { waited <- tg.WaitAdmitted(10 * time.Second) }()

	// A new write (after the 2A/06 unit attention) is refused as
	// transitioning, and does not stay counted.
	r := execOn(t, tg, n, 0, cdb10(opWrite10, 0, 9, 1), pattern(512, 8), 0)
	if k, a, q := r.kcq(); k == KeyUnitAttention && a == 0x2A && q == 0x06 {
		r = execOn(t, tg, n, 0, cdb10(opWrite10, 0, 9, 1), pattern(512, 8), 0)
	}
	if k, a, q := r.kcq(); r.status != StatusCheckCondition || k != KeyNotReady || a != 0x04 || q != 0x0A {
		t.Fatalf("new write while transitioning: status %#x sense %x/%x/%x, want NOT READY 04/0A", r.status, k, a, q)
	}
	select {
	case err := <-waited:
		t.Fatalf("WaitAdmitted returned %v with a write still at the device", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(dev.release)
	if err := <-waited; err != nil {
		t.Fatalf("WaitAdmitted: %v", err)
	}
	if r := <-first; r.status != StatusGood {
		k, a, q := r.kcq()
		t.Fatalf("write admitted before the change: status %#x sense %x/%x/%x, want GOOD", r.status, k, a, q)
	}
	if n := tg.Admitted(); n != 0 {
		t.Fatalf("admitted %d after completion", n)
	}
}

// TestWaitAdmittedTimeout: a command that never completes makes
// WaitAdmitted fail after its bound, so a switch-over can be refused.
func TestWaitAdmittedTimeout(t *testing.T) {
	dev, tg := newHeldTarget(t, nil)
	n := &Nexus{InitiatorName: "iqn.a", InitiatorPort: "iqn.a,i,0x1", TargetName: "iqn.t", RelativePort: 1}
	tur := []byte{opTestUnitReady, 0, 0, 0, 0, 0}
	for i := 0; i < 4 && execOn(t, tg, n, 0, tur, nil, 0).status != StatusGood; i++ {
	}
	done := make(chan struct{})
	tg.Execute(&Task{Nexus: n, CDB: cdb10(opWrite10, 0, 8, 1), DataOut: pattern(512, 7), ExpectedOut: 512}, func(r *Result) {
		r.Release()
		close(done)
	})
	<-dev.started
	if err := tg.WaitAdmitted(20 * time.Millisecond); !errors.Is(err, ErrAdmittedTimeout) {
		t.Fatalf("WaitAdmitted with a stuck write: %v, want ErrAdmittedTimeout", err)
	}
	close(dev.release)
	<-done
	if err := tg.WaitAdmitted(time.Second); err != nil {
		t.Fatalf("WaitAdmitted after completion: %v", err)
	}
}
