package repl_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/repl/driver"
)

// After a clean restart (SIGTERM, start) of the secondary the bitmap
// resync makes it Inconsistent/SyncTarget until it is done. The primary
// must report the peer's disk as it is (Inconsistent) in every place an
// operator looks: `repl status`, `vmsan status`, the events and the
// vmsan_repl_peer_disk_state series; never UpToDate before the resync is
// done. The SyncTarget itself shows its progress (done, rate, ETA, in text
// and JSON), and a promote there says how far the resync got. Before the
// fix the primary said peer-disk:UpToDate throughout, and the target
// showed no progress and refused the promote with "resync or verify in
// progress".
func TestResyncStateAfterCleanRestart(t *testing.T) {
	// 24 MiB at 4 MiB/s: about six seconds of resync to look at.
	p := newPair(t, pairOpts{extra: []string{"--resync-rate", "4M"}})
	p.b.stop() // SIGTERM: a clean stop
	waitUntil(t, "primary notices", 10*time.Second, func() bool { return p.a.status().Conn == "Connecting" })
	mustIO(t, p.a.uri(), writes(0x91, 0, 1<<20, 1<<20, 24)...)
	p.b.start()

	var (
		sourceSeen, textSeen, tableSeen, metricSeen, eventSeen bool
		targetText, targetJSON, promoteSeen                    bool
		promoteMsg                                             string
	)
	textRe := regexp.MustCompile(`replication:SyncTarget peer-disk:UpToDate done:[0-9.]+ out-of-sync:\d+KiB rate:\d+KiB/s eta:\S+`)
	deadline := time.Now().Add(60 * time.Second)
	for {
		sa, sb := p.a.status(), p.b.status()
		if sa.Conn == "Connected" && sb.Conn == "Connected" && sb.Disk == "UpToDate" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("resync did not finish:\n a=%+v\n b=%+v", sa, sb)
		}
		if sa.Conn == "SyncSource" {
			sourceSeen = true
			if sa.PeerDisk != "Inconsistent" {
				t.Fatalf("primary is SyncSource and reports peer disk %s (secondary: %s/%s)", sa.PeerDisk, sb.Conn, sb.Disk)
			}
			if out, err := p.a.vmsanOut("repl", "status", volName); err == nil && strings.Contains(out, "replication:SyncSource") {
				textSeen = true
				if !strings.Contains(out, "peer-disk:Inconsistent") {
					t.Fatalf("repl status on the SyncSource:\n%s", out)
				}
			}
			if out, err := p.a.vmsanOut("status"); err == nil && regexp.MustCompile(`(?m)^vm1 +Primary +UpToDate +SyncSource `).MatchString(out) {
				tableSeen = true
				if !regexp.MustCompile(`(?m)^vm1 +Primary +UpToDate +SyncSource +Secondary +Inconsistent `).MatchString(out) {
					t.Fatalf("vmsan status on the SyncSource:\n%s", out)
				}
			}
			if m := p.a.scrape(); metric(m, `vmsan_repl_connection_state{state="SyncSource",volume="vm1"}`) == 1 {
				metricSeen = true
				if metric(m, `vmsan_repl_peer_disk_state{state="UpToDate",volume="vm1"}`) != 0 ||
					metric(m, `vmsan_repl_peer_disk_state{state="Inconsistent",volume="vm1"}`) != 1 {
					t.Fatalf("metrics on the SyncSource:\n%s", grepLines(m, "vmsan_repl_peer_disk_state"))
				}
			}
			if out, err := p.a.vmsanOut("events", "--now"); err == nil && strings.Contains(out, "connection:SyncSource") {
				eventSeen = true
				if !strings.Contains(out, "connection:SyncSource peer_role:Secondary peer_disk:Inconsistent") {
					t.Fatalf("events on the SyncSource:\n%s", out)
				}
			}
		}
		if sb.Conn == "SyncTarget" && sb.SyncTotal > 0 && sb.SyncLeft < sb.SyncTotal && sb.SyncLeft > 0 {
			if out, err := p.b.vmsanOut("repl", "status", volName); err == nil && textRe.MatchString(out) {
				targetText = true
			}
			if out, err := p.b.vmsanOut("repl", "status", volName, "--json"); err == nil {
				var js []driver.Status
				if json.Unmarshal([]byte(out), &js) == nil && len(js) == 1 && js[0].Conn == "SyncTarget" &&
					js[0].SyncPct > 0 && js[0].SyncPct < 100 && js[0].SyncRate > 0 && js[0].ETASeconds > 0 && js[0].SyncTotal >= 24<<20 {
					targetJSON = true
				}
			}
			if !promoteSeen {
				if out, err := p.b.vmsanOut("repl", "promote", volName); err == nil {
					t.Fatalf("promote of the SyncTarget succeeded:\n%s", out)
				} else if strings.Contains(out, "local disk Inconsistent (") && regexp.MustCompile(`\(\d+ % synced\)`).MatchString(out) {
					promoteSeen, promoteMsg = true, strings.TrimSpace(out)
				} else if p.b.status().Conn == "SyncTarget" {
					t.Fatalf("promote of the SyncTarget refused without saying how far the resync is:\n%s", out)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("seen on the source: status %v text %v table %v metric %v event %v; on the target: text %v json %v promote %q",
		sourceSeen, textSeen, tableSeen, metricSeen, eventSeen, targetText, targetJSON, promoteMsg)
	if !sourceSeen || !textSeen || !tableSeen || !metricSeen || !eventSeen {
		t.Fatal("the resync ended before every view of the SyncSource was checked")
	}
	if !targetText || !targetJSON || !promoteSeen {
		t.Fatal("the SyncTarget never showed done/rate/ETA in text and JSON, or its promote refusal did not give the progress")
	}
	p.waitSynced(t, 30*time.Second)
	if sa := p.a.status(); sa.PeerDisk != "UpToDate" {
		t.Fatalf("after the resync the primary reports peer disk %s", sa.PeerDisk)
	}
	mustIO(t, p.a.uri(), "flush")
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after the resync")
	}
}

// kill -9 of the SyncTarget at about 30 % of a rate-limited resync, then
// a restart: the resync continues with what was left, not with the whole
// dirty amount again (the target's activity log used to cover every
// extent it had resynced in the last al_retire, which is all of them at
// the default 5 s), and the replicas end byte-equal.
func TestResyncResumesAfterSyncTargetKill(t *testing.T) {
	const dirty = 48 << 20
	// al-retire 250 ticks of 20 ms: the default 5 s.
	p := newPair(t, pairOpts{size: "64M", extra: []string{"--resync-rate", "8M", "--al-retire-ticks", "250"}})
	p.b.kill9()
	waitUntil(t, "primary notices", 10*time.Second, func() bool { return p.a.status().Conn == "Connecting" })
	mustIO(t, p.a.uri(), writes(0x92, 0, 1<<20, 1<<20, dirty>>20)...)
	if oos := p.a.status().OutOfSync; oos != dirty {
		t.Fatalf("out of sync before the resync: %d, want %d", oos, dirty)
	}
	p.b.start()
	var first driver.Status
	waitUntil(t, "resync at 30 %", 60*time.Second, func() bool {
		first = p.a.status()
		return first.Conn == "SyncSource" && first.SyncLeft <= first.SyncTotal*7/10
	})
	p.b.kill9()
	waitUntil(t, "primary notices the kill", 10*time.Second, func() bool { return p.a.status().Conn == "Connecting" })
	atKill := p.a.status().OutOfSync
	p.b.start()
	var again driver.Status
	waitUntil(t, "resync resumes", 60*time.Second, func() bool {
		again = p.a.status()
		return again.Conn == "SyncSource" && again.SyncTotal > 0
	})
	whole := first.SyncTotal
	t.Logf("first resync: %s total, %s left when the target was killed (source's count after the kill %s); resumed with %s to sync",
		mib(whole), mib(first.SyncLeft), mib(atKill), mib(again.SyncTotal))
	if whole < dirty {
		t.Fatalf("first resync total %d, less than the %d written while the secondary was down", whole, dirty)
	}
	// Near where it stopped: what was left at the kill, plus at most a
	// tenth of the whole for progress not yet recorded on the target.
	if again.SyncTotal > atKill+whole/10 || again.SyncTotal >= whole {
		t.Fatalf("resumed resync has %s to sync; %s were left when the target was killed (whole amount %s)",
			mib(again.SyncTotal), mib(atKill), mib(whole))
	}
	p.waitSynced(t, 60*time.Second)
	mustIO(t, p.a.uri(), "flush")
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after the resumed resync")
	}
	mustIO(t, p.a.uri(), reads(0x92, 0, 1<<20, 1<<20, dirty>>20)...)
}

// rawHas reports whether n's backing file holds byte pat over [off, off+l).
func (n *node) rawHas(off, l int64, pat byte) bool {
	n.t.Helper()
	f, err := os.Open(filepath.Join(n.dir, "volumes", volName+".raw"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, l)
	if _, err := f.ReadAt(b, off); err != nil {
		n.t.Fatal(err)
	}
	return bytes.Count(b, []byte{pat}) == len(b)
}

// Split brain resolved by hand with the one-shot `vmsan repl connect VOL
// --discard-my-data` on the node whose changes are dropped: no policy
// change and no restart. It becomes SyncTarget and ends with the
// survivor's data; the survivor keeps its own.
func TestDiscardMyDataResolvesSplitBrain(t *testing.T) {
	p := newPair(t, pairOpts{})
	mustIO(t, p.a.uri(), "write -P 0x41 0 1M")
	p.px.Drop(true)
	waitUntil(t, "disconnect", 10*time.Second, func() bool { return p.b.status().Conn == "Connecting" })
	if err := p.b.admin("promote"); err != nil {
		t.Fatal(err)
	}
	mustIO(t, p.a.uri(), "write -P 0x42 2M 64k")
	mustIO(t, p.b.uri(), "write -P 0x43 4M 64k", "write -P 0x44 8M 1M")
	p.px.Drop(false)
	waitUntil(t, "split brain reported", 20*time.Second, func() bool {
		sa, sb := p.a.status(), p.b.status()
		return sa.Conn == "StandAlone" && sb.Conn == "StandAlone" &&
			strings.Contains(sa.LastError, "split brain") && strings.Contains(sb.LastError, "split brain")
	})
	// Refused on a primary: its data is what its clients see.
	if out := p.b.vmsanFails("repl", "connect", volName, "--discard-my-data"); !strings.Contains(out, "demote") {
		t.Fatalf("discard-my-data on a primary: %s", out)
	}
	p.b.run("repl", "demote", volName)
	p.b.run("repl", "connect", volName, "--discard-my-data")
	p.a.run("repl", "connect", volName)
	p.waitSynced(t, 30*time.Second)
	sa, sb := p.a.status(), p.b.status()
	t.Logf("a decision %q, b decision %q", sa.Decision, sb.Decision)
	if !strings.Contains(sb.Decision, "target") || !strings.Contains(sb.Decision, "discard-my-data") {
		t.Fatalf("b's decision %q: not a sync target by discard-my-data", sb.Decision)
	}
	if sa.Role != "Primary" || sb.Role != "Secondary" {
		t.Fatalf("roles after the resolution: a %s, b %s", sa.Role, sb.Role)
	}
	mustIO(t, p.a.uri(), "flush")
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("replicas differ after discard-my-data")
	}
	// b (a secondary now: read its backing file) has the survivor's data;
	// its own split-brain writes are gone.
	if !p.b.rawHas(2<<20, 64<<10, 0x42) || !p.b.rawHas(4<<20, 64<<10, 0) || !p.b.rawHas(8<<20, 1<<20, 0) || !p.b.rawHas(0, 1<<20, 0x41) {
		t.Fatal("b does not hold the survivor's data")
	}
	mustIO(t, p.a.uri(), "read -P 0x42 2M 64k", "read -P 0 4M 64k", "read -P 0x41 0 1M")
}
