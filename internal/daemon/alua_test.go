package daemon

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/iscsi/iscsifront"
	"github.com/vmsan/vmsan/internal/scsi"
)

// scsiRes is a copied scsi.Result.
type scsiRes struct {
	status uint8
	key    uint8
	asc    uint8
	ascq   uint8
	data   []byte
}

func execSCSI(t *scsi.Target, n *scsi.Nexus, cdb []byte, in uint32) scsiRes {
	ch := make(chan scsiRes, 1)
	t.Execute(&scsi.Task{Nexus: n, LUN: 0, CDB: cdb, ExpectedIn: in}, func(r *scsi.Result) {
		out := scsiRes{status: r.Status, data: append([]byte(nil), r.DataIn...)}
		if len(r.Sense) >= 14 && r.Sense[0]&0x7F == 0x70 {
			out.key, out.asc, out.ascq = r.Sense[2]&0x0F, r.Sense[12], r.Sense[13]
		}
		r.Release()
		ch <- out
	})
	return <-ch
}

// rtpg runs REPORT TARGET PORT GROUPS and returns group -> (state, ports).
func rtpg(t *testing.T, tg *scsi.Target, n *scsi.Nexus) map[uint16]string {
	t.Helper()
	cdb := []byte{0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0}
	r := execSCSI(tg, n, cdb, 4096)
	if r.status != 0 || len(r.data) < 4 {
		t.Fatalf("RTPG: status %d sense %x/%x/%x", r.status, r.key, r.asc, r.ascq)
	}
	out := map[uint16]string{}
	b := r.data[4:]
	for len(b) >= 8 {
		state := b[0] & 0x0F
		g := binary.BigEndian.Uint16(b[2:])
		np := int(b[7])
		if len(b) < 8+4*np {
			t.Fatalf("RTPG: truncated descriptor")
		}
		s := fmt.Sprintf("state=%x ports=", state)
		for i := 0; i < np; i++ {
			s += fmt.Sprintf("%d,", binary.BigEndian.Uint16(b[8+4*i+2:]))
		}
		out[g] = s
		b = b[8+4*np:]
	}
	return out
}

// freeLoopback returns a loopback address that was free a moment ago (the
// configuration refuses port 0).
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// drainUA issues TEST UNIT READY until it answers other than UNIT
// ATTENTION.
func drainUA(t *testing.T, tg *scsi.Target, n *scsi.Nexus) {
	t.Helper()
	var r scsiRes
	for i := 0; i < 10; i++ {
		// Standby and transitioning answer TEST UNIT READY with NOT READY:
		// only UNIT ATTENTION is pending state.
		if r = execSCSI(tg, n, make([]byte, 6), 0); r.status == 0 || r.key != 6 {
			return
		}
	}
	t.Fatalf("TEST UNIT READY: unit attentions never end: status %d sense %x/%x/%x", r.status, r.key, r.asc, r.ascq)
}

// TestReplicatedPairALUA: a per-volume target of a replicated volume lists
// this node's groups and the peer's (iscsi.peer_portals), and the role set
// through Daemon.setVolumeRole (the role controller's subscriber) decides their states: primary active/
// optimized with the peer standby, secondary the reverse (I/O: NOT READY
// 04/0B), changing transitioning (04/0A), each change a unit attention
// 2A/06. scsi_id makes the NAA designator the configured one.
func TestReplicatedPairALUA(t *testing.T) {
	const id = "5f0c2d9e-0b7e-4c55-9a41-2b1f0e9f6c11"
	p1, p2 := freeLoopback(t), freeLoopback(t)
	r := start(t, t.TempDir(), func(c *config.Config) {
		c.ISCSI = config.ISCSI{
			Mode:     config.ISCSIModePerVolume,
			NodeName: "a",
			Listen: []config.ISCSIPortal{{Addr: p1, TPGT: 1, RelativePort: 1},
				{Addr: p2, TPGT: 2, RelativePort: 2}},
			PeerPortals: []config.ISCSIPortal{{Addr: "127.0.0.2:3260", TPGT: 11, RelativePort: 11}},
			Targets:     []config.ISCSITarget{{Volume: config.DefaultVolumeName, SCSIID: id}},
			AllowAny:    true,
		}
	})
	var fe *iscsifront.FrontEnd
	for _, f := range r.d.frontEnds {
		if x, ok := f.(*iscsifront.FrontEnd); ok {
			fe = x
		}
	}
	if fe == nil {
		t.Fatal("no iSCSI front end")
	}
	if ps := fe.Show().Portals; len(ps) != 2 || ps[0].RelativePort != 1 || ps[1].RelativePort != 2 {
		t.Fatalf("relative ports %+v", ps)
	}
	tgs := fe.Targets()
	if len(tgs) != 1 {
		t.Fatalf("%d targets", len(tgs))
	}
	tg := tgs[0].LUs.(*scsi.Target)
	n := &scsi.Nexus{InitiatorName: "iqn.x:i", InitiatorPort: "iqn.x:i,i,0x1", RelativePort: 1, PortGroup: 1}
	drainUA(t, tg, n)

	// Standalone: this node's two groups, active/optimized; no peer.
	got := rtpg(t, tg, n)
	if len(got) != 2 || got[1] != "state=0 ports=1," || got[2] != "state=0 ports=2," {
		t.Fatalf("standalone RTPG: %v", got)
	}

	read10 := []byte{0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0}
	steps := []struct {
		role      VolumeRole
		own, peer string
		io        [2]uint8 // asc/ascq of a READ (0,0: GOOD)
	}{
		{RoleSecondary, "state=2", "state=0", [2]uint8{0x04, 0x0B}},
		{RoleChanging, "state=f", "state=0", [2]uint8{0x04, 0x0A}},
		{RolePrimary, "state=0", "state=2", [2]uint8{0, 0}},
		{RoleChanging, "state=f", "state=2", [2]uint8{0x04, 0x0A}},
		{RoleSecondary, "state=2", "state=0", [2]uint8{0x04, 0x0B}},
	}
	for _, s := range steps {
		r.d.setVolumeRole(config.DefaultVolumeName, s.role)
		ua := execSCSI(tg, n, make([]byte, 6), 0)
		if ua.status != 2 || ua.key != 6 || ua.asc != 0x2A || ua.ascq != 0x06 {
			t.Fatalf("%v: first command got status %d sense %x/%x/%x, want UNIT ATTENTION 2A/06", s.role, ua.status, ua.key, ua.asc, ua.ascq)
		}
		drainUA(t, tg, n)
		got := rtpg(t, tg, n)
		if len(got) != 3 || got[1] != s.own+" ports=1," || got[2] != s.own+" ports=2," || got[11] != s.peer+" ports=11," {
			t.Fatalf("%v: RTPG %v", s.role, got)
		}
		rd := execSCSI(tg, n, read10, 512)
		if s.io == [2]uint8{} {
			if rd.status != 0 {
				t.Fatalf("%v: READ status %d sense %x/%x/%x", s.role, rd.status, rd.key, rd.asc, rd.ascq)
			}
		} else if rd.status != 2 || rd.key != 2 || rd.asc != s.io[0] || rd.ascq != s.io[1] {
			t.Fatalf("%v: READ status %d sense %x/%x/%x, want NOT READY %x/%x", s.role, rd.status, rd.key, rd.asc, rd.ascq, s.io[0], s.io[1])
		}
	}

	// Every command above completed: the switch-over's drain (through the
	// per-volume target) finds nothing admitted and returns at once.
	if err := r.d.drainVolume(config.DefaultVolumeName, time.Second); err != nil {
		t.Fatalf("DrainVolume with nothing in flight: %v", err)
	}
	if n := tg.Admitted(); n != 0 {
		t.Fatalf("admitted %d after every command completed", n)
	}

	// VPD 83: the NAA designator comes from scsi_id, not the volume UUID;
	// the unit serial number (VPD 80) is the scsi_id's hex digits.
	vpd80 := execSCSI(tg, n, []byte{0x12, 1, 0x80, 0, 255, 0}, 255)
	if vpd80.status != 0 || string(vpd80.data[4:]) != "5f0c2d9e0b7e4c559a412b1f0e9f6c11" {
		t.Fatalf("VPD 80: status %d %q", vpd80.status, vpd80.data)
	}
}
