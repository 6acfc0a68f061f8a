package scsi

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/export/exporttest"
)

// res is a copied Result (the original is released at once, as a
// transport would after sending it).
type res struct {
	status      uint8
	sense       []byte
	data        []byte
	resid       uint32
	over, under bool
}

// key, asc, ascq of fixed or descriptor sense.
func (r res) kcq() (uint8, uint8, uint8) {
	if len(r.sense) < 14 {
		if len(r.sense) >= 4 && r.sense[0]&0x7F == 0x72 {
			return r.sense[1] & 0x0F, r.sense[2], r.sense[3]
		}
		return 0xFF, 0xFF, 0xFF
	}
	if r.sense[0]&0x7F == 0x72 {
		return r.sense[1] & 0x0F, r.sense[2], r.sense[3]
	}
	return r.sense[2] & 0x0F, r.sense[12], r.sense[13]
}

type fixture struct {
	t   *testing.T
	tg  *Target
	dev *exporttest.Device
	reg *exporttest.Registry
	n   *Nexus
	dir string
}

const testSize = 4 << 20

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dev := exporttest.NewMemDevice(t, "vol", testSize)
	dev.Meta.UUID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	dev.Meta.MaxBlock = 1 << 20
	return newFixtureDev(t, dev)
}

func newFixtureDev(t *testing.T, dev *exporttest.Device) *fixture {
	t.Helper()
	f := &fixture{t: t, dev: dev, reg: exporttest.NewRegistry(dev), dir: t.TempDir()}
	f.tg = f.newTarget()
	f.n = &Nexus{InitiatorName: "iqn.a", InitiatorPort: "iqn.a,i,0x000000000001", TargetName: "iqn.t", RelativePort: 1}
	t.Cleanup(f.tg.Close)
	return f
}

func (f *fixture) newTarget() *Target {
	return New(Config{
		Registry: f.reg,
		LUNs:     func() []LUN { return []LUN{{Number: 0, Volume: "vol"}} },
		StateDir: func(string) (string, error) { return f.dir, nil },
	})
}

func (f *fixture) exec(n *Nexus, cdb []byte, out []byte, expIn uint32) res {
	f.t.Helper()
	return execOn(f.t, f.tg, n, 0, cdb, out, expIn)
}

func execOn(t testing.TB, tg *Target, n *Nexus, lun uint64, cdb []byte, out []byte, expIn uint32) res {
	t.Helper()
	ch := make(chan res, 1)
	tg.Execute(&Task{Nexus: n, LUN: lun, CDB: cdb, DataOut: out, ExpectedOut: uint32(len(out)), ExpectedIn: expIn}, func(r *Result) {
		c := res{status: r.Status, sense: append([]byte(nil), r.Sense...), data: append([]byte(nil), r.DataIn...),
			resid: r.Residual, over: r.Overflow, under: r.Underflow}
		r.Release()
		ch <- c
	})
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatalf("cdb % x: no completion", cdb)
	}
	return res{}
}

// ready clears the nexus's pending unit attentions.
func (f *fixture) ready(n *Nexus) {
	f.t.Helper()
	for i := 0; i < 20; i++ {
		if r := f.exec(n, []byte{opTestUnitReady, 0, 0, 0, 0, 0}, nil, 0); r.status == StatusGood {
			return
		}
	}
	f.t.Fatal("unit attentions never cleared")
}

func (f *fixture) good(n *Nexus, cdb, out []byte, expIn uint32) res {
	f.t.Helper()
	r := f.exec(n, cdb, out, expIn)
	if r.status != StatusGood {
		k, a, q := r.kcq()
		f.t.Fatalf("cdb % x: status %#x sense %x/%02x/%02x", cdb, r.status, k, a, q)
	}
	return r
}

func (f *fixture) check(n *Nexus, cdb, out []byte, expIn uint32, key, asc, ascq uint8) res {
	f.t.Helper()
	r := f.exec(n, cdb, out, expIn)
	k, a, q := r.kcq()
	if r.status != StatusCheckCondition || k != key || a != asc || q != ascq {
		f.t.Fatalf("cdb % x: status %#x sense %x/%02x/%02x, want CHECK CONDITION %x/%02x/%02x", cdb, r.status, k, a, q, key, asc, ascq)
	}
	return r
}

func cdb10(op uint8, flags uint8, lba uint32, n uint16) []byte {
	b := make([]byte, 10)
	b[0], b[1] = op, flags
	binary.BigEndian.PutUint32(b[2:], lba)
	binary.BigEndian.PutUint16(b[7:], n)
	return b
}

func cdb16(op uint8, flags uint8, lba uint64, n uint32) []byte {
	b := make([]byte, 16)
	b[0], b[1] = op, flags
	binary.BigEndian.PutUint64(b[2:], lba)
	binary.BigEndian.PutUint32(b[10:], n)
	return b
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}
