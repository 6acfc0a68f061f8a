package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/volrt"
)

type feSource struct {
	fakeSource
	fes []volrt.FrontEndStats
}

func (f feSource) FrontEnds() []volrt.FrontEndStats { return f.fes }

func TestCollectFrontEnds(t *testing.T) {
	src := feSource{fes: []volrt.FrontEndStats{{
		Name: "nbd", Accepted: 3, Active: 2, Requests: 10, ErrorReplies: 1, BytesRead: 4096, BytesWritten: 8192,
		Clients: []volrt.Session{
			{FrontEnd: "nbd", Volume: "vm1", Remote: "10.0.0.2:5000", Since: time.Now()},
			{FrontEnd: "nbd", Volume: "vm1", Remote: "10.0.0.3:5000", Since: time.Now()},
		},
	}}}
	out := scrape(t, src)
	for _, want := range []string{
		`vmsan_frontend_connections_accepted_total{frontend="nbd"} 3`,
		`vmsan_frontend_connections_active{frontend="nbd"} 2`,
		`vmsan_frontend_requests_total{frontend="nbd"} 10`,
		`vmsan_frontend_error_replies_total{frontend="nbd"} 1`,
		`vmsan_frontend_bytes_total{direction="write",frontend="nbd"} 8192`,
		`vmsan_frontend_volume_clients{frontend="nbd",volume="vm1"} 2`,
		`vmsan_nbd_connections_accepted_total 3`, // existing names still served
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s", want)
		}
	}
	if strings.Contains(out, "10.0.0.2") {
		t.Error("client addresses must not become labels")
	}
	// The vmsan_nbd_* series belong to the NBD front end only.
	src.fes[0].Name = "iscsi"
	src.fes[0].LoginFailures = map[string]uint64{"authentication": 2, "authorization": 0}
	out = scrape(t, src)
	if strings.Contains(out, "vmsan_nbd_") {
		t.Error("vmsan_nbd_* series without an NBD front end")
	}
	for _, want := range []string{
		`vmsan_iscsi_login_failures_total{reason="authentication"} 2`,
		`vmsan_iscsi_login_failures_total{reason="authorization"} 0`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s", want)
		}
	}
}
