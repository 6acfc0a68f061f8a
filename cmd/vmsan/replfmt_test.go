package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

var (
	stConnected = driver.Status{Volume: "vm1", Role: "Primary", Disk: "UpToDate", Conn: "Connected",
		PeerRole: "Secondary", PeerDisk: "UpToDate"}
	stSyncing = driver.Status{Volume: "vm1", Role: "Primary", Disk: "UpToDate", Conn: "SyncSource",
		PeerRole: "Secondary", PeerDisk: "Inconsistent", OutOfSync: 5 << 20, SyncTotal: 8 << 20, SyncLeft: 5 << 20,
		SyncPct: 37.5, SyncRate: 1 << 20, ETASeconds: 5, PendingWrites: 3}
	stTarget = driver.Status{Volume: "vm2", Role: "Secondary", Disk: "Inconsistent", Conn: "SyncTarget",
		PeerRole: "Primary", PeerDisk: "UpToDate", OutOfSync: 3 << 20, SyncTotal: 4 << 20, SyncLeft: 3 << 20,
		SyncPct: 25, SyncRate: 1 << 20, ETASeconds: 3}
	// What the node reports once the peer is gone: its role and disk are
	// Unknown, and they must not be printed as if current.
	stDisconnected = driver.Status{Volume: "vm1", Role: "Primary", Disk: "UpToDate", Conn: "Connecting",
		PeerRole: "Unknown", PeerDisk: "Unknown", OutOfSync: 256 << 10, LastError: "ping timeout"}
	stStandAlone = driver.Status{Volume: "vm1", Role: "Secondary", Disk: "UpToDate", Conn: "StandAlone",
		PeerRole: "Unknown", PeerDisk: "Unknown", LastError: "split-brain: both sides wrote since generation 6101"}
)

func TestReplBlocksGolden(t *testing.T) {
	for _, c := range []struct {
		name string
		st   []driver.Status
		want string
	}{
		{"connected", []driver.Status{stConnected}, `vm1 role:Primary
  disk:UpToDate
  peer role:Secondary
    replication:Established peer-disk:UpToDate
`},
		{"syncing", []driver.Status{stSyncing, stTarget}, `vm1 role:Primary
  disk:UpToDate
  peer role:Secondary
    replication:SyncSource peer-disk:Inconsistent done:37.50 out-of-sync:5120KiB rate:1024KiB/s eta:5s pending:3
vm2 role:Secondary
  disk:Inconsistent
  peer role:Primary
    replication:SyncTarget peer-disk:UpToDate done:25.00 out-of-sync:3072KiB rate:1024KiB/s eta:3s
`},
		{"disconnected", []driver.Status{stDisconnected}, `vm1 role:Primary
  disk:UpToDate
  peer connection:Connecting
    out-of-sync:256KiB last-error:"ping timeout"
`},
		{"standalone", []driver.Status{stStandAlone}, `vm1 role:Secondary
  disk:UpToDate
  peer connection:StandAlone
    last-error:"split-brain: both sides wrote since generation 6101"
`},
		{"discard-my-data", []driver.Status{func() driver.Status { s := stStandAlone; s.DiscardMyData = true; return s }()}, `vm1 role:Secondary
  disk:UpToDate
  peer connection:StandAlone
    last-error:"split-brain: both sides wrote since generation 6101" discard-my-data:yes
`},
		{"none", nil, ``},
	} {
		t.Run(c.name, func(t *testing.T) {
			var b bytes.Buffer
			writeReplBlocks(&b, c.st)
			if b.String() != c.want {
				t.Errorf("got:\n%s\nwant:\n%s", b.String(), c.want)
			}
		})
	}
}

func TestReplTableGolden(t *testing.T) {
	var b bytes.Buffer
	writeReplTable(&b, []driver.Status{stSyncing, stTarget, stDisconnected})
	want := `VOLUME  ROLE       DISK          CONNECTION  PEER ROLE  PEER DISK     OUT OF SYNC  RESYNC
vm1     Primary    UpToDate      SyncSource  Secondary  Inconsistent  5.0 MiB      37.5% eta 5s
vm2     Secondary  Inconsistent  SyncTarget  Primary    UpToDate      3.0 MiB      25.0% eta 3s
vm1     Primary    UpToDate      Connecting  Unknown    Unknown       256.0 KiB    -
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

// `vmsan status` gets the replication section as decoded JSON; it must
// come out as the table, not as a JSON blob.
func TestStatusReplicationTable(t *testing.T) {
	b, _ := json.Marshal([]driver.Status{stConnected})
	var raw any
	json.Unmarshal(b, &raw)
	var out bytes.Buffer
	printStatus(&out, daemon.Status{PID: 1, DataDir: "/d", Extra: map[string]any{"replication": raw}})
	s := out.String()
	if !strings.Contains(s, "replication:\nVOLUME  ROLE") || !strings.Contains(s, "vm1     Primary  UpToDate  Connected   Secondary  UpToDate") {
		t.Errorf("no replication table:\n%s", s)
	}
	if strings.Contains(s, `"peer_role"`) || strings.Contains(s, "{") {
		t.Errorf("replication printed as JSON:\n%s", s)
	}
}

func TestFilterRepl(t *testing.T) {
	got, err := filterRepl([]driver.Status{stConnected, stTarget}, "vm2")
	if err != nil || len(got) != 1 || got[0].Volume != "vm2" {
		t.Fatalf("filter vm2: %v %v", got, err)
	}
	if _, err := filterRepl([]driver.Status{stConnected, stTarget}, "nope"); err == nil ||
		!strings.Contains(err.Error(), `"nope" is not replicated`) || !strings.Contains(err.Error(), "vm1, vm2") {
		t.Fatalf("unknown volume: %v", err)
	}
}
