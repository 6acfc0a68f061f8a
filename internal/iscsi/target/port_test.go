package target

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

// TestServePortNexus: a session's nexus carries the relative port and
// portal group of the listener it came in on, as given to ServePort (the
// daemon passes the configured ids; relying on Serve order gave ids that
// depended on which Serve goroutine ran first).
func TestServePortNexus(t *testing.T) {
	lu := newRAMLU(1 << 20)
	tg := Target{Name: testIQN, LUs: lu, Volumes: []string{"ram"}, AllowAny: true}
	srv := New(Config{Targets: func() []Target { return []Target{tg} }})
	var lns []net.Listener
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
	}
	// Started in the reverse order of their ids.
	go srv.ServePort(lns[1], 6, 9)
	// The second starts only once the first is registered (the order is
	// what the test is about).
	registered := func() int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.lnOrder)
	}
	for deadline := time.Now().Add(10 * time.Second); registered() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first portal was not registered")
		}
	}
	go srv.ServePort(lns[0], 5, 7)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	for k, want := range [][2]uint16{{7, 5}, {9, 6}} {
		i := dial(t, lns[k].Addr().String())
		i.login()
		i.send(&pdu.SCSICommand{Final: true, ITT: 1, CmdSN: i.cmdSN, CDB: [16]byte{}}, nil)
		expect[*pdu.SCSIResponse](i)
		n := lu.nexus.Load()
		if n == nil || n.RelativePort != want[0] || n.PortGroup != want[1] {
			t.Fatalf("portal %d: nexus %+v, want relative port %d group %d", k, n, want[0], want[1])
		}
	}
}
