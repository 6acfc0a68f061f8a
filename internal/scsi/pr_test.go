package scsi

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func prOut(sa, typ uint8, resKey, saKey uint64, flags byte) ([]byte, []byte) {
	cdb := []byte{opPROut, sa, typ, 0, 0, 0, 0, 0, 24, 0}
	pl := make([]byte, 24)
	binary.BigEndian.PutUint64(pl[0:], resKey)
	binary.BigEndian.PutUint64(pl[8:], saKey)
	pl[20] = flags
	return cdb, pl
}

func (f *fixture) prOut(n *Nexus, sa, typ uint8, resKey, saKey uint64, flags byte) res {
	f.t.Helper()
	cdb, pl := prOut(sa, typ, resKey, saKey, flags)
	return f.exec(n, cdb, pl, 0)
}

func (f *fixture) prOK(n *Nexus, sa, typ uint8, resKey, saKey uint64, flags byte) {
	f.t.Helper()
	cdb, pl := prOut(sa, typ, resKey, saKey, flags)
	f.good(n, cdb, pl, 0)
}

func (f *fixture) prIn(n *Nexus, sa uint8) []byte {
	f.t.Helper()
	return f.good(n, []byte{opPRIn, sa, 0, 0, 0, 0, 0, 0x10, 0, 0}, nil, 4096).data
}

func (f *fixture) keys(n *Nexus) (gen uint32, keys []uint64) {
	d := f.prIn(n, prInReadKeys)
	for i := 8; i < 8+int(binary.BigEndian.Uint32(d[4:])); i += 8 {
		keys = append(keys, binary.BigEndian.Uint64(d[i:]))
	}
	return binary.BigEndian.Uint32(d), keys
}

func nexus(name string, rel uint16) *Nexus {
	return &Nexus{InitiatorName: name, InitiatorPort: name + ",i,0x00023d000001", TargetName: "iqn.t", RelativePort: rel}
}

var (
	tur = []byte{opTestUnitReady, 0, 0, 0, 0, 0}
	rd1 = cdb10(opRead10, 0, 0, 1)
	wr1 = cdb10(opWrite10, 0, 0, 1)
)

func (f *fixture) access(n *Nexus) (read, write bool) {
	f.t.Helper()
	r := f.exec(n, rd1, nil, 512)
	w := f.exec(n, wr1, make([]byte, 512), 0)
	for _, x := range []res{r, w} {
		if x.status != StatusGood && x.status != StatusReservationConflict {
			k, a, q := x.kcq()
			f.t.Fatalf("unexpected status %#x %x/%x/%x", x.status, k, a, q)
		}
	}
	return r.status == StatusGood, w.status == StatusGood
}

// TestPRTypeAccess: for every reservation type, what a registered
// non-holder and an unregistered nexus may do (SPC-4 table 43).
func TestPRTypeAccess(t *testing.T) {
	for _, tc := range []struct {
		typ                  uint8
		regRead, regWrite    bool
		otherRead, otherWrit bool
	}{
		{prTypeWE, true, false, true, false},
		{prTypeEA, false, false, false, false},
		{prTypeWERO, true, true, true, false},
		{prTypeEARO, true, true, false, false},
		{prTypeWEAR, true, true, true, false},
		{prTypeEAAR, true, true, false, false},
	} {
		f := newFixture(t)
		a, b, c := nexus("iqn.a", 1), nexus("iqn.b", 1), nexus("iqn.c", 2)
		for _, n := range []*Nexus{a, b, c} {
			f.ready(n)
		}
		f.prOK(a, prRegister, 0, 0, 0xA, 0)
		f.prOK(b, prRegister, 0, 0, 0xB, 0)
		f.prOK(a, prReserve, tc.typ, 0xA, 0, 0)
		if r, w := f.access(a); !r || !w {
			t.Fatalf("type %d: holder read %v write %v", tc.typ, r, w)
		}
		if r, w := f.access(b); r != tc.regRead || w != tc.regWrite {
			t.Errorf("type %d: registrant read %v write %v, want %v %v", tc.typ, r, w, tc.regRead, tc.regWrite)
		}
		if r, w := f.access(c); r != tc.otherRead || w != tc.otherWrit {
			t.Errorf("type %d: other read %v write %v, want %v %v", tc.typ, r, w, tc.otherRead, tc.otherWrit)
		}
		// Always allowed: INQUIRY, TUR, READ CAPACITY, PR IN, REPORT LUNS.
		f.good(c, inq(false, 0, 36), nil, 36)
		f.good(c, tur, nil, 0)
		f.good(c, cdb10(opReadCapacity10, 0, 0, 0), nil, 8)
		f.prIn(c, prInReadResv)
		// READ RESERVATION: key (0 for all registrants) and type.
		d := f.prIn(b, prInReadResv)
		wantKey := uint64(0xA)
		if allRegs(tc.typ) {
			wantKey = 0
		}
		if binary.BigEndian.Uint32(d[4:]) != 16 || binary.BigEndian.Uint64(d[8:]) != wantKey || d[21] != tc.typ {
			t.Errorf("type %d: READ RESERVATION % x", tc.typ, d)
		}
		// A release of another type: INVALID RELEASE OF PERSISTENT RESERVATION.
		other := uint8(prTypeWE)
		if tc.typ == prTypeWE {
			other = prTypeEA
		}
		cdb, pl := prOut(prRelease, other, 0xA, 0, 0)
		f.check(a, cdb, pl, 0, KeyIllegalRequest, 0x26, 0x04)
		f.prOK(a, prRelease, tc.typ, 0xA, 0, 0)
		if r, w := f.access(c); !r || !w {
			t.Errorf("type %d: after release other read %v write %v", tc.typ, r, w)
		}
	}
}

func TestPRRegistrationRules(t *testing.T) {
	f := newFixture(t)
	a, b := nexus("iqn.a", 1), nexus("iqn.b", 1)
	f.ready(a)
	f.ready(b)
	// Unregistered with a non-zero reservation key: conflict.
	if r := f.prOut(a, prRegister, 0, 5, 0xA, 0); r.status != StatusReservationConflict {
		t.Fatalf("register with a stray key: %#x", r.status)
	}
	f.prOK(a, prRegister, 0, 0, 0xA, 0)
	f.prOK(b, prRegister, 0, 0, 0xB, 0)
	if gen, keys := f.keys(a); gen != 2 || len(keys) != 2 || keys[0] != 0xA || keys[1] != 0xB {
		t.Fatalf("keys gen %d %x", gen, keys)
	}
	// Change a key: needs the old one.
	if r := f.prOut(a, prRegister, 0, 0xB, 0xAA, 0); r.status != StatusReservationConflict {
		t.Fatal("key change with the wrong key accepted")
	}
	f.prOK(a, prRegister, 0, 0xA, 0xAA, 0)
	f.prOK(a, prRegisterIgnore, 0, 0x1234, 0xA, 0)
	// Reserve needs registration and the right key.
	c := nexus("iqn.c", 1)
	f.ready(c)
	if r := f.prOut(c, prReserve, prTypeWE, 0, 0, 0); r.status != StatusReservationConflict {
		t.Fatal("unregistered reserve accepted")
	}
	if r := f.prOut(a, prReserve, prTypeWE, 0xB, 0, 0); r.status != StatusReservationConflict {
		t.Fatal("reserve with another's key accepted")
	}
	cdb, pl := prOut(prReserve, 2, 0xA, 0, 0)
	f.check(a, cdb, pl, 0, KeyIllegalRequest, 0x24, 0)
	f.prOK(a, prReserve, prTypeWE, 0xA, 0, 0)
	f.prOK(a, prReserve, prTypeWE, 0xA, 0, 0) // same again: no change
	if r := f.prOut(b, prReserve, prTypeWE, 0xB, 0, 0); r.status != StatusReservationConflict {
		t.Fatal("second holder accepted")
	}
	// Parameter list length other than 24; ALL_TG_PT; SPEC_I_PT.
	f.check(a, []byte{opPROut, prRegister, 0, 0, 0, 0, 0, 0, 20, 0}, make([]byte, 20), 0, KeyIllegalRequest, 0x1A, 0)
	cdb, pl = prOut(prRegister, 0, 0xA, 0xA, 0x04)
	f.check(a, cdb, pl, 0, KeyIllegalRequest, 0x26, 0)
	cdb, pl = prOut(prRegister, 0, 0xA, 0xA, 0x08)
	f.check(a, cdb, pl, 0, KeyIllegalRequest, 0x26, 0)
	// Unregistering the holder releases a WE reservation.
	f.prOK(a, prRegister, 0, 0xA, 0, 0)
	if d := f.prIn(b, prInReadResv); binary.BigEndian.Uint32(d[4:]) != 0 {
		t.Fatal("reservation survived its holder's unregistration")
	}
	// REPORT CAPABILITIES and READ FULL STATUS.
	d := f.prIn(a, prInReportCaps)
	if d[1] != 8 || d[2]&0x11 != 0x11 || d[3]&0x80 == 0 || d[4] != 0xEA || d[5] != 1 {
		t.Fatalf("capabilities % x", d)
	}
	f.prOK(b, prReserve, prTypeEARO, 0xB, 0, 0)
	d = f.prIn(a, prInReadFullStatus)
	if binary.BigEndian.Uint32(d[4:]) != uint32(len(d)-8) || binary.BigEndian.Uint64(d[8:]) != 0xB ||
		d[8+12]&1 == 0 || d[8+13] != prTypeEARO || binary.BigEndian.Uint16(d[8+18:]) != 1 {
		t.Fatalf("full status % x", d)
	}
	tid := d[8+24:]
	if tid[0] != 0x45 || !strings.HasPrefix(string(tid[4:]), "iqn.b,i,0x00023d000001") {
		t.Fatalf("transport id % x", tid[:8])
	}
}

func TestPRPreemptClear(t *testing.T) {
	f := newFixture(t)
	var aborted []*Nexus
	var mu sync.Mutex
	f.tg = New(Config{Registry: f.reg, LUNs: func() []LUN { return []LUN{{0, "vol"}} }, Abort: func(n *Nexus, lun uint64) {
		mu.Lock()
		aborted = append(aborted, n)
		mu.Unlock()
	}})
	t.Cleanup(f.tg.Close)
	a, b, c := nexus("iqn.a", 1), nexus("iqn.b", 1), nexus("iqn.c", 1)
	for _, n := range []*Nexus{a, b, c} {
		f.ready(n)
	}
	f.prOK(a, prRegister, 0, 0, 0xA, 0)
	f.prOK(b, prRegister, 0, 0, 0xB, 0)
	f.prOK(c, prRegister, 0, 0, 0xC, 0)
	f.prOK(a, prReserve, prTypeWE, 0xA, 0, 0)
	// B preempts the holder A with a new type: A's registration goes
	// (2A/05 to A), C is told the reservation changed type (2A/04).
	f.prOK(b, prPreemptAbort, prTypeEA, 0xB, 0xA, 0)
	if len(aborted) != 1 || aborted[0] != a {
		t.Fatalf("PREEMPT AND ABORT aborted %v", aborted)
	}
	f.check(a, tur, nil, 0, KeyUnitAttention, 0x2A, 0x05)
	f.check(c, tur, nil, 0, KeyUnitAttention, 0x2A, 0x04)
	if _, keys := f.keys(b); len(keys) != 2 || keys[0] != 0xB || keys[1] != 0xC {
		t.Fatalf("keys after preempt %x", keys)
	}
	if d := f.prIn(b, prInReadResv); binary.BigEndian.Uint64(d[8:]) != 0xB || d[21] != prTypeEA {
		t.Fatalf("reservation after preempt % x", d)
	}
	// Preempting a non-holder's key only removes the registration.
	f.prOK(b, prPreempt, prTypeEA, 0xB, 0xC, 0)
	f.check(c, tur, nil, 0, KeyUnitAttention, 0x2A, 0x05)
	// No registration with that key: conflict; sa key 0 without
	// all-registrants reservation: invalid field in parameter list.
	if r := f.prOut(b, prPreempt, prTypeEA, 0xB, 0x77, 0); r.status != StatusReservationConflict {
		t.Fatalf("preempt of a missing key: %#x", r.status)
	}
	cdb, pl := prOut(prPreempt, prTypeEA, 0xB, 0, 0)
	f.check(b, cdb, pl, 0, KeyIllegalRequest, 0x26, 0)
	// CLEAR: everything goes, 2A/03 to the others.
	f.prOK(a, prRegister, 0, 0, 0xA, 0)
	f.prOK(b, prClear, 0, 0xB, 0, 0)
	f.check(a, tur, nil, 0, KeyUnitAttention, 0x2A, 0x03)
	if gen, keys := f.keys(a); len(keys) != 0 || gen == 0 {
		t.Fatalf("after clear: gen %d keys %x", gen, keys)
	}
	if r, w := f.access(c); !r || !w {
		t.Fatal("access after clear")
	}
	// All-registrants: preempt with key 0 takes over alone.
	f.prOK(a, prRegister, 0, 0, 0xA, 0)
	f.prOK(b, prRegister, 0, 0, 0xB, 0)
	f.prOK(a, prReserve, prTypeWEAR, 0xA, 0, 0)
	f.prOK(b, prPreempt, prTypeWE, 0xB, 0, 0)
	f.check(a, tur, nil, 0, KeyUnitAttention, 0x2A, 0x05)
	if d := f.prIn(b, prInReadResv); binary.BigEndian.Uint64(d[8:]) != 0xB || d[21] != prTypeWE {
		t.Fatalf("reservation after all-registrants preempt % x", d)
	}
}

func TestPRRegisterAndMove(t *testing.T) {
	f := newFixture(t)
	a, b := nexus("iqn.a", 1), nexus("iqn.b", 2)
	f.ready(a)
	f.ready(b)
	f.prOK(a, prRegister, 0, 0, 0xA, 0)
	f.prOK(a, prReserve, prTypeEA, 0xA, 0, 0)
	tid := transportID(b.InitiatorPort)
	pl := make([]byte, 24+len(tid))
	binary.BigEndian.PutUint64(pl[0:], 0xA)
	binary.BigEndian.PutUint64(pl[8:], 0xB)
	pl[17] = 0x02 // UNREG
	binary.BigEndian.PutUint16(pl[18:], 2)
	binary.BigEndian.PutUint32(pl[20:], uint32(len(tid)))
	copy(pl[24:], tid)
	f.good(a, []byte{opPROut, prRegisterMove, prTypeEA, 0, 0, 0, 0, 0, byte(len(pl)), 0}, pl, 0)
	if _, keys := f.keys(b); len(keys) != 1 || keys[0] != 0xB {
		t.Fatalf("keys after move %x", keys)
	}
	if r, w := f.access(b); !r || !w {
		t.Fatal("new holder cannot access")
	}
	if r, w := f.access(a); r || w {
		t.Fatal("old holder still has access under EA")
	}
}

// TestPRAPTPL: with APTPL the state survives a new Target (a restart)
// and is written atomically in the state dir; clearing APTPL removes it.
func TestPRAPTPL(t *testing.T) {
	f := newFixture(t)
	a, b := nexus("iqn.a", 1), nexus("iqn.b", 1)
	f.ready(a)
	f.prOK(a, prRegister, 0, 0, 0xA, 0x01)
	f.ready(b)
	// The last REGISTER's APTPL decides (SPC-4): B keeps it set.
	f.prOK(b, prRegister, 0, 0, 0xB, 0x01)
	f.prOK(a, prReserve, prTypeWERO, 0xA, 0, 0)
	if _, err := os.Stat(filepath.Join(f.dir, prFile)); err != nil {
		t.Fatal(err)
	}
	f.tg.Close()
	f.tg = f.newTarget()
	t.Cleanup(f.tg.Close)
	a2, c := nexus("iqn.a", 1), nexus("iqn.c", 1)
	f.ready(a2)
	f.ready(c)
	if _, keys := f.keys(a2); len(keys) != 2 {
		t.Fatalf("keys after restart %x", keys)
	}
	d := f.prIn(a2, prInReadResv)
	if binary.BigEndian.Uint64(d[8:]) != 0xA || d[21] != prTypeWERO {
		t.Fatalf("reservation after restart % x", d)
	}
	if d := f.prIn(c, prInReportCaps); d[3]&1 == 0 {
		t.Fatal("PTPL_A not reported")
	}
	if _, w := f.access(c); w {
		t.Fatal("restored reservation not enforced")
	}
	if r, w := f.access(a2); !r || !w {
		t.Fatal("the same I_T nexus is not the holder after restart")
	}
	// Registering with APTPL=0 drops persistence.
	f.prOK(a2, prRegister, 0, 0xA, 0xA, 0)
	if _, err := os.Stat(filepath.Join(f.dir, prFile)); !os.IsNotExist(err) {
		t.Fatalf("state file after APTPL=0: %v", err)
	}
	// Without a state dir APTPL is refused.
	f2 := newFixture(t)
	f2.tg = New(Config{Registry: f2.reg, LUNs: func() []LUN { return []LUN{{0, "vol"}} }})
	t.Cleanup(f2.tg.Close)
	f2.ready(a)
	cdb, pl := prOut(prRegister, 0, 0, 0xA, 0x01)
	f2.check(a, cdb, pl, 0, KeyIllegalRequest, 0x26, 0)
}

func TestReserve6(t *testing.T) {
	f := newFixture(t)
	a, b := nexus("iqn.a", 1), nexus("iqn.b", 1)
	f.ready(a)
	f.ready(b)
	f.good(a, []byte{opReserve6, 0, 0, 0, 0, 0}, nil, 0)
	if r, w := f.access(b); r || w {
		t.Fatal("RESERVE(6) not enforced")
	}
	f.good(b, inq(false, 0, 36), nil, 36)
	if r := f.exec(b, []byte{opReserve6, 0, 0, 0, 0, 0}, nil, 0); r.status != StatusReservationConflict {
		t.Fatal("second RESERVE accepted")
	}
	f.good(b, []byte{opRelease6, 0, 0, 0, 0, 0}, nil, 0) // not the holder: no effect
	if r, _ := f.access(b); r {
		t.Fatal("a non-holder's RELEASE released")
	}
	if r := f.prOut(b, prRegister, 0, 0, 0xB, 0); r.status != StatusReservationConflict {
		t.Fatal("PR OUT under RESERVE(6) accepted")
	}
	// The reservation goes with its nexus.
	f.tg.NexusLost(a)
	if r, w := f.access(b); !r || !w {
		t.Fatal("RESERVE(6) survived the nexus")
	}
	// Registrations make RESERVE(6) conflict.
	f.prOK(b, prRegister, 0, 0, 0xB, 0)
	if r := f.exec(a, []byte{opReserve6, 0, 0, 0, 0, 0}, nil, 0); r.status != StatusReservationConflict && r.status != StatusCheckCondition {
		t.Fatal("RESERVE(6) beside registrations accepted")
	}
}
