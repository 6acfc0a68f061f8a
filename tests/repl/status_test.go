package repl_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

// vmsanOut runs the vmsan CLI against n's data dir and returns its output
// and error (no t.Fatal: some calls are expected to fail).
func (n *node) vmsanOut(args ...string) (string, error) {
	out, err := exec.Command(vmsanBin, append(args, "--data-dir", n.dir)...).CombinedOutput()
	return string(out), err
}

// scrape fetches /metrics from n's control socket.
func (n *node) scrape() string {
	n.t.Helper()
	sock := filepath.Join(n.dir, daemon.ControlSocketName)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Get("http://vmsan/metrics")
	if err != nil {
		n.t.Fatalf("%s: scrape: %v", n.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		n.t.Fatalf("%s: scrape: %s\n%s", n.name, resp.Status, b)
	}
	return string(b)
}

// metric returns the value of the series line starting with series
// ("name{labels}"), or -1 when absent.
func metric(text, series string) float64 {
	for _, l := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// The operator's view on two real processes: `repl status` in the drbdadm
// layout (peer fields unknown while the secondary is down), its JSON and
// volume filter, the `vmsan status` table, the Prometheus series across a
// secondary outage and resync, and the log lines.
func TestOperatorStatusMetricsLogs(t *testing.T) {
	p := newPair(t, pairOpts{})
	out, err := p.a.vmsanOut("repl", "status", volName)
	if err != nil {
		t.Fatalf("repl status: %v\n%s", err, out)
	}
	want := "vm1 role:Primary\n  disk:UpToDate\n  peer role:Secondary\n    replication:Established peer-disk:UpToDate\n"
	if out != want {
		t.Fatalf("connected: repl status printed\n%s\nwant\n%s", out, want)
	}
	m := p.a.scrape()
	for series, v := range map[string]float64{
		`vmsan_repl_connection_state{state="Connected",volume="vm1"}`: 1,
		`vmsan_repl_role{role="Primary",volume="vm1"}`:                1,
		`vmsan_repl_peer_role{role="Secondary",volume="vm1"}`:         1,
		`vmsan_repl_peer_disk_state{state="UpToDate",volume="vm1"}`:   1,
		`vmsan_repl_out_of_sync_bytes{volume="vm1"}`:                  0,
		`vmsan_repl_pending_writes{volume="vm1"}`:                     0,
	} {
		if got := metric(m, series); got != v {
			t.Errorf("connected: %s = %v, want %v", series, got, v)
		}
	}
	mustIO(t, p.a.uri(), writes(0x21, 0, 64<<10, 64<<10, 32)...)
	m = p.a.scrape()
	if n := metric(m, `vmsan_repl_peer_ack_latency_seconds_count{volume="vm1"}`); n < 32 {
		t.Errorf("peer ack latency count %v after 32 protocol C writes", n)
	}
	discBefore := metric(m, `vmsan_repl_disconnects_total{reason="peer_closed",volume="vm1"}`) +
		metric(m, `vmsan_repl_disconnects_total{reason="io_error",volume="vm1"}`) +
		metric(m, `vmsan_repl_disconnects_total{reason="ping_timeout",volume="vm1"}`)

	// The secondary dies and stays down; the primary writes on.
	p.b.kill9()
	waitUntil(t, "a notices", 20*time.Second, func() bool { return p.a.status().Conn != "Connected" })
	mustIO(t, p.a.uri(), writes(0x22, 8<<20, 64<<10, 128<<10, 8)...)
	out, err = p.a.vmsanOut("repl", "status", volName)
	if err != nil {
		t.Fatalf("repl status: %v\n%s", err, out)
	}
	t.Logf("secondary down, repl status:\n%s", out)
	re := regexp.MustCompile(`^vm1 role:Primary\n  disk:UpToDate\n  peer connection:(Connecting|Handshake)\n    out-of-sync:512KiB last-error:"[^"\n]+"\n$`)
	if !re.MatchString(out) {
		t.Errorf("secondary down: repl status printed\n%s", out)
	}
	if strings.Contains(out, "Secondary") || strings.Contains(out, "peer-disk") {
		t.Errorf("stale peer fields while the secondary is down:\n%s", out)
	}
	jout, err := p.a.vmsanOut("repl", "status", volName, "--json")
	var js []map[string]any
	if err != nil || json.Unmarshal([]byte(jout), &js) != nil || len(js) != 1 {
		t.Fatalf("repl status --json: %v\n%s", err, jout)
	}
	if js[0]["peer_role"] != "Unknown" || js[0]["peer_disk"] != "Unknown" || js[0]["out_of_sync_bytes"] != float64(512<<10) {
		t.Errorf("repl status --json while the secondary is down: %v", js[0])
	}
	if out, err := p.a.vmsanOut("repl", "status", "nosuch"); err == nil || !strings.Contains(out, `"nosuch" is not replicated`) {
		t.Errorf("repl status of an unknown volume: err %v\n%s", err, out)
	}
	sout, err := p.a.vmsanOut("status")
	if err != nil || !regexp.MustCompile(`(?m)^replication:\nVOLUME +ROLE +DISK +CONNECTION +PEER ROLE +PEER DISK +OUT OF SYNC +RESYNC\nvm1 +Primary +UpToDate +(Connecting|Handshake) +Unknown +Unknown +512\.0 KiB +-\n`).MatchString(sout) {
		t.Errorf("vmsan status: %v\n%s", err, sout)
	}
	m = p.a.scrape()
	for series, v := range map[string]float64{
		`vmsan_repl_connection_state{state="Connected",volume="vm1"}`: 0,
		`vmsan_repl_peer_role{role="Unknown",volume="vm1"}`:           1,
		`vmsan_repl_peer_role{role="Secondary",volume="vm1"}`:         0,
		`vmsan_repl_peer_disk_state{state="Unknown",volume="vm1"}`:    1,
		`vmsan_repl_out_of_sync_bytes{volume="vm1"}`:                  512 << 10,
	} {
		if got := metric(m, series); got != v {
			t.Errorf("secondary down: %s = %v, want %v", series, got, v)
		}
	}
	discAfter := metric(m, `vmsan_repl_disconnects_total{reason="peer_closed",volume="vm1"}`) +
		metric(m, `vmsan_repl_disconnects_total{reason="io_error",volume="vm1"}`) +
		metric(m, `vmsan_repl_disconnects_total{reason="ping_timeout",volume="vm1"}`)
	if discAfter <= discBefore {
		t.Errorf("disconnects by reason did not count the secondary's death:\n%s", grepLines(m, "vmsan_repl_disconnects_total"))
	}

	// Back: resync, then everything is in sync again.
	p.b.start()
	p.waitSynced(t, 60*time.Second)
	m = p.a.scrape()
	if got := metric(m, `vmsan_repl_out_of_sync_bytes{volume="vm1"}`); got != 0 {
		t.Errorf("after resync: out of sync %v", got)
	}
	if got := metric(m, `vmsan_repl_resync_bytes_total{kind="data",volume="vm1"}`) + metric(m, `vmsan_repl_resync_bytes_total{kind="zero",volume="vm1"}`); got < 512<<10 {
		t.Errorf("after resync: resync bytes %v, want >= %d", got, 512<<10)
	}
	out, _ = p.a.vmsanOut("repl", "status")
	if out != want {
		t.Errorf("after resync: repl status printed\n%s\nwant\n%s", out, want)
	}
	var st driver.Status = p.a.status()
	if st.PeerRole != "Secondary" {
		t.Errorf("after resync: peer role %s", st.PeerRole)
	}
	// Log lines an operator greps for.
	logA, _ := os.ReadFile(filepath.Join(p.a.dir, "serve.log"))
	logB, _ := os.ReadFile(filepath.Join(p.b.dir, "serve.log"))
	// (The bytes are at least what was written while the secondary was
	// down; more when the secondary's own bitmap adds to it.)
	for _, c := range []struct {
		log  []byte
		want string
	}{
		{logA, `msg="replication connected" volume=vm1 component=repl peer=`},
		{logA, `msg="replication disconnected" volume=vm1 component=repl peer=\S+ reason="[^"]+" kind=(peer_closed|io_error|ping_timeout)`},
		// peer_disk: the bitmap resync makes the peer Inconsistent until
		// it is done, whatever its Hello said.
		{logA, `msg="replication established" volume=vm1 component=repl peer=\S+ peer_role=Secondary peer_disk=Inconsistent decision=bitmap-source out_of_sync_bytes=\d+`},
		{logA, `msg="resync started" volume=vm1 component=repl direction="to peer \(SyncSource\)" bytes=\d+`},
		{logA, `msg="resync finished" volume=vm1 component=repl direction="to peer \(SyncSource\)" bytes=\d+ seconds=[0-9.]+ bytes_per_sec=\d+`},
		{logB, `msg="resync finished" volume=vm1 component=repl direction="from peer \(SyncTarget\)" bytes=\d+ seconds=[0-9.]+ bytes_per_sec=\d+`},
	} {
		if !regexp.MustCompile(c.want).Match(c.log) {
			t.Errorf("log lacks %s", c.want)
		}
	}
	if sm := regexp.MustCompile(`msg="resync started" .*direction="to peer \(SyncSource\)" bytes=(\d+)`).FindAllSubmatch(logA, -1); len(sm) > 0 {
		if n, _ := strconv.ParseInt(string(sm[len(sm)-1][1]), 10, 64); n < 512<<10 {
			t.Errorf("resync started with %d bytes, less than the %d written while the secondary was down", n, 512<<10)
		}
	}
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
