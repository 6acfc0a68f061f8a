package daemon

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/config"
)

// TestMetricsIndex: GET / on the metrics listener is a page linking
// /metrics (and pprof when enabled), like other exporters; an unknown path
// stays 404.
func TestMetricsIndex(t *testing.T) {
	for _, pprof := range []bool{false, true} {
		r := start(t, t.TempDir(), func(c *config.Config) {
			c.MetricsListen = "127.0.0.1:0"
			c.Pprof = pprof
		})
		get := func(path string) (int, string) {
			t.Helper()
			resp, err := http.Get("http://" + r.d.MetricsAddr().String() + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		code, body := get("/")
		if code != http.StatusOK || !strings.Contains(body, `href="/metrics"`) {
			t.Fatalf("pprof=%v: GET / = %d\n%s", pprof, code, body)
		}
		if got := strings.Contains(body, `href="/debug/pprof/"`); got != pprof {
			t.Errorf("pprof=%v: index links pprof: %v\n%s", pprof, got, body)
		}
		if code, _ := get("/nothing-here"); code != http.StatusNotFound {
			t.Errorf("GET /nothing-here = %d, want 404", code)
		}
		r.stop()
	}
}
