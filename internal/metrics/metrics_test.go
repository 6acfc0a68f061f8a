package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/volrt"
)

type fakeSource struct {
	vols []Volume
}

func (f fakeSource) Volumes() []Volume { return f.vols }

func scrape(t *testing.T, src Source) string {
	t.Helper()
	rec := httptest.NewRecorder()
	Handler(src).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	if rec.Code != 200 {
		t.Fatalf("status %d: %s", rec.Code, b)
	}
	return string(b)
}

func TestCollect(t *testing.T) {
	es := ioengine.Stats{
		Requests:      ioengine.OpCounts{Read: 7, Write: 64, Flush: 2},
		BackendOps:    ioengine.OpCounts{Read: 7, Write: 4, Flush: 2},
		Merged:        60,
		Errors:        3,
		NoSpaceErrors: 2,
		BytesWritten:  64 * 4096,
		QueueDepth:    3,
		Latency:       ioengine.Histogram{UpperBounds: []int64{1000, 2000, 4000}, Counts: []uint64{5, 10, 1, 2}, Count: 18, Sum: 30000},
		WriteSizes:    ioengine.Histogram{UpperBounds: []int64{4096, 65536}, Counts: []uint64{0, 4, 0}, Count: 4, Sum: 64 * 4096},
	}
	src := feSource{
		fakeSource: fakeSource{vols: []Volume{{Name: "vm1", Size: 1 << 30, Allocated: 8192, Connections: 2, Engine: &es}, {Name: "closed", Size: 512}}},
		fes: []volrt.FrontEndStats{{Name: "nbd", Accepted: 5, Active: 2, BytesWritten: 262144,
			Commands: []volrt.CommandCount{{Command: "read", Count: 7}, {Command: "write", Count: 64}, {Command: "disc"}, {Command: "flush", Count: 2}}}},
	}
	out := scrape(t, src)
	for _, want := range []string{
		`vmsan_volume_size_bytes{volume="vm1"} 1.073741824e+09`,
		`vmsan_volume_size_bytes{volume="closed"} 512`,
		`vmsan_volume_connections{volume="vm1"} 2`,
		`vmsan_engine_requests_total{op="write",volume="vm1"} 64`,
		`vmsan_engine_backend_ops_total{op="write",volume="vm1"} 4`,
		`vmsan_engine_merged_requests_total{volume="vm1"} 60`,
		`vmsan_engine_errors_total{volume="vm1"} 3`,
		`vmsan_engine_no_space_errors_total{volume="vm1"} 2`,
		`vmsan_engine_bytes_total{direction="write",volume="vm1"} 262144`,
		`vmsan_engine_queue_depth{volume="vm1"} 3`,
		// Cumulative buckets, bounds converted from ns to seconds.
		`vmsan_engine_request_latency_seconds_bucket{volume="vm1",le="1e-06"} 5`,
		`vmsan_engine_request_latency_seconds_bucket{volume="vm1",le="2e-06"} 15`,
		`vmsan_engine_request_latency_seconds_bucket{volume="vm1",le="4e-06"} 16`,
		`vmsan_engine_request_latency_seconds_bucket{volume="vm1",le="+Inf"} 18`,
		`vmsan_engine_request_latency_seconds_sum{volume="vm1"} 3e-05`,
		`vmsan_engine_backend_write_size_bytes_bucket{volume="vm1",le="65536"} 4`,
		`vmsan_nbd_connections_accepted_total 5`,
		`vmsan_nbd_requests_total{command="write"} 64`,
		`vmsan_nbd_bytes_total{direction="write"} 262144`,
		`go_goroutines`,
	} {
		if !strings.Contains(out, want+"\n") && !strings.Contains(out, want+" ") && !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	// A closed volume has no engine series.
	if strings.Contains(out, `vmsan_engine_requests_total{op="write",volume="closed"}`) {
		t.Error("engine series for a volume without an engine")
	}
}

type replSource struct {
	fakeSource
	reps []Replica
}

func (r replSource) Replicas() []Replica { return r.reps }

func TestCollectReplication(t *testing.T) {
	rep := Replica{Volume: "vm1", Role: "Primary", Disk: "UpToDate", Conn: "Connecting", PeerRole: "Unknown", PeerDisk: "Unknown",
		OutOfSync: 262144, PendingWrites: 2, ResyncBytes: 4096, ReplicatedBytes: 8192,
		Disconnects: map[string]uint64{"ping_timeout": 3, "admin": 0},
		AckLatency:  ioengine.Histogram{UpperBounds: []int64{1e6, 1e7}, Counts: []uint64{4, 1, 0}, Count: 5, Sum: 9e6}}
	out := scrape(t, replSource{fakeSource: fakeSource{}, reps: []Replica{rep}})
	for _, want := range []string{
		`vmsan_repl_role{role="Primary",volume="vm1"} 1`,
		`vmsan_repl_role{role="Secondary",volume="vm1"} 0`,
		`vmsan_repl_peer_role{role="Unknown",volume="vm1"} 1`,
		`vmsan_repl_peer_role{role="Secondary",volume="vm1"} 0`,
		`vmsan_repl_disk_state{state="UpToDate",volume="vm1"} 1`,
		`vmsan_repl_disk_state{state="Inconsistent",volume="vm1"} 0`,
		`vmsan_repl_peer_disk_state{state="Unknown",volume="vm1"} 1`,
		`vmsan_repl_connection_state{state="Connecting",volume="vm1"} 1`,
		`vmsan_repl_connection_state{state="Connected",volume="vm1"} 0`,
		`vmsan_repl_connection_state{state="VerifyTarget",volume="vm1"} 0`,
		`vmsan_repl_out_of_sync_bytes{volume="vm1"} 262144`,
		`vmsan_repl_pending_writes{volume="vm1"} 2`,
		`vmsan_repl_resync_rate_bytes_per_second{volume="vm1"} 0`,
		`vmsan_repl_resync_bytes_total{kind="data",volume="vm1"} 4096`,
		`vmsan_repl_resync_bytes_total{kind="zero",volume="vm1"} 0`,
		`vmsan_repl_replicated_bytes_total{volume="vm1"} 8192`,
		`vmsan_repl_disconnects_total{reason="ping_timeout",volume="vm1"} 3`,
		`vmsan_repl_disconnects_total{reason="admin",volume="vm1"} 0`,
		`vmsan_repl_peer_ack_latency_seconds_bucket{volume="vm1",le="0.001"} 4`,
		`vmsan_repl_peer_ack_latency_seconds_bucket{volume="vm1",le="0.01"} 5`,
		`vmsan_repl_peer_ack_latency_seconds_count{volume="vm1"} 5`,
		`vmsan_repl_peer_ack_latency_seconds_sum{volume="vm1"} 0.009`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("missing %q", want)
		}
	}
	// Sources without replication have no repl series.
	if out := scrape(t, fakeSource{}); strings.Contains(out, "vmsan_repl_") {
		t.Error("replication series without a ReplicaSource")
	}
}
