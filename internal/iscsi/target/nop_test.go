package target

import (
	"bytes"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

// TestNopAnswered: an initiator that answers the target's pings keeps
// its connection however short the timers (the defaults are 1 s + 1 s).
func TestNopAnswered(t *testing.T) {
	ts := startServer(t, func(c *Config, _ *Target) {
		c.NopInterval, c.NopTimeout = 100*time.Millisecond, 100*time.Millisecond
	})
	i := dial(t, ts.addr)
	i.login()
	pings := 0
	end := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(end) {
		i.c.SetReadDeadline(end)
		f, err := i.rd.Read()
		if err != nil {
			break // the deadline (a close fails the nop below)
		}
		n, ok := f.Header.(*pdu.NOPIn)
		if !ok || n.ITT != pdu.ReservedTag {
			t.Fatalf("got %T %+v", f.Header, f.Header)
		}
		pings++
		i.send(&pdu.NOPOut{ITT: pdu.ReservedTag, TTT: n.TTT, CmdSN: i.cmdSN, Immediate: true}, nil)
	}
	if pings < 3 {
		t.Fatalf("%d pings in 1.5 s with a 100 ms interval", pings)
	}
	i.nop(7)
	if n, _ := expect[*pdu.NOPIn](i); n.ITT != 7 {
		t.Fatalf("NOP-In for ITT %d", n.ITT)
	}
	if st := ts.srv.Stats(); st.NopTimeouts != 0 {
		t.Fatalf("%d NOP timeouts on an answering initiator", st.NopTimeouts)
	}
}

// TestNopStalledWriter: an initiator that keeps sending but takes no data
// fills the target's socket, then its queue, which stalls the reader
// (silence does not count then: the reader is not listening). The stalled
// write itself must close the connection, or the reader would resume,
// after the initiator failed over, with whatever the network held.
func TestNopStalledWriter(t *testing.T) {
	ts := startServer(t, func(c *Config, _ *Target) {
		c.NopInterval, c.NopTimeout = 100*time.Millisecond, 200*time.Millisecond
	})
	i := dial(t, ts.addr)
	i.login()
	data := bytes.Repeat([]byte{'n'}, 8192)
	deadline := time.Now().Add(20 * time.Second)
	i.c.SetWriteDeadline(deadline)
	var err error
	for itt := uint32(1); err == nil; itt++ {
		var b []byte
		if b, err = pdu.AppendPDU(nil, &pdu.NOPOut{ITT: itt, TTT: pdu.ReservedTag, CmdSN: i.cmdSN, Immediate: true}, nil, data, i.dig); err != nil {
			t.Fatal(err)
		}
		_, err = i.c.Write(b)
	}
	if time.Now().After(deadline) {
		t.Fatalf("the target kept a connection whose peer takes no data: %v", err)
	}
	if st := ts.srv.Stats(); st.NopTimeouts != 1 {
		t.Fatalf("NopTimeouts %d, want 1 (write error %v)", st.NopTimeouts, err)
	}
}
