package repl_test

import (
	"strings"
	"testing"
	"time"
)

// What the operator reads on two real processes: a peer stopped cleanly
// (SIGTERM) is "peer stopped" in the primary's last error, not the raw
// "read: EOF"; a replication command on a volume that is not replicated
// names the volume.
func TestPeerStoppedAndUnknownVolumeWords(t *testing.T) {
	p := newPair(t, pairOpts{size: "16M"})
	p.b.stop()
	waitUntil(t, "a notices", 20*time.Second, func() bool { return p.a.status().Conn != "Connected" })
	st := p.a.status()
	if !strings.Contains(st.LastError, "peer stopped") || strings.Contains(st.LastError, "EOF") {
		t.Errorf("last error after the peer's SIGTERM: %q, want it to say the peer stopped", st.LastError)
	}
	out, err := p.a.vmsanOut("repl", "status", volName)
	if err != nil || !strings.Contains(out, `last-error:"peer stopped`) {
		t.Errorf("repl status: %v\n%s", err, out)
	}
	for _, args := range [][]string{{"repl", "promote", "nope"}, {"volume", "promote", "nope"}, {"repl", "verify", "nope"}} {
		if out := p.a.vmsanFails(args...); !strings.Contains(out, `"nope"`) {
			t.Errorf("vmsan %s does not name the volume:\n%s", strings.Join(args, " "), out)
		}
	}
}
