package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/ioengine"
	"github.com/vmsan/vmsan/internal/nbd/server"
)

type fakeSource struct {
	vols []Volume
	st   server.Stats
}

func (f fakeSource) Volumes() []Volume                 { return f.vols }
func (f fakeSource) ServerStats() (server.Stats, bool) { return f.st, true }

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
		Requests:     ioengine.OpCounts{Read: 7, Write: 64, Flush: 2},
		BackendOps:   ioengine.OpCounts{Read: 7, Write: 4, Flush: 2},
		Merged:       60,
		BytesWritten: 64 * 4096,
		QueueDepth:   3,
		Latency:      ioengine.Histogram{UpperBounds: []int64{1000, 2000, 4000}, Counts: []uint64{5, 10, 1, 2}, Count: 18, Sum: 30000},
		WriteSizes:   ioengine.Histogram{UpperBounds: []int64{4096, 65536}, Counts: []uint64{0, 4, 0}, Count: 4, Sum: 64 * 4096},
	}
	src := fakeSource{
		vols: []Volume{{Name: "vm1", Size: 1 << 30, Allocated: 8192, Connections: 2, Engine: &es}, {Name: "closed", Size: 512}},
		st:   server.Stats{Accepted: 5, ActiveConns: 2, BytesWritten: 262144, Requests: [8]uint64{7, 64, 0, 2}},
	}
	out := scrape(t, src)
	for _, want := range []string{
		`vmsan_volume_size_bytes{volume="vm1"} 1.073741824e+09`,
		`vmsan_volume_size_bytes{volume="closed"} 512`,
		`vmsan_volume_connections{volume="vm1"} 2`,
		`vmsan_engine_requests_total{op="write",volume="vm1"} 64`,
		`vmsan_engine_backend_ops_total{op="write",volume="vm1"} 4`,
		`vmsan_engine_merged_requests_total{volume="vm1"} 60`,
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
