package config

import (
	"strings"
	"testing"
)

// TestNBDSection: the nbd: section sets the NBD front end's keys; the old
// top-level keys are still read, each named in Deprecated; setting one in
// both places is refused; Marshal writes the nbd: form, which reads back
// the same.
func TestNBDSection(t *testing.T) {
	n, err := Parse([]byte("nbd:\n  listen: [\"127.0.0.1:0\"]\n  max_payload: 1M\n  max_connections: 7\n  tls: {mode: off}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Listen) != 1 || n.Listen[0] != "127.0.0.1:0" || n.MaxPayload != 1<<20 || n.MaxConnections != 7 || len(n.Deprecated) != 0 {
		t.Fatalf("nbd: section: %+v", n)
	}
	if n.NBD.Listen != nil || n.NBD.TLS != nil {
		t.Fatalf("nbd: section left in Config.NBD after decoding: %+v", n.NBD)
	}

	old, err := Parse([]byte("listen: [\"127.0.0.1:0\"]\nmax_payload: 1M\nmax_connections: 7\nlog_level: info\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(old.Listen) != 1 || old.MaxPayload != 1<<20 || old.MaxConnections != 7 {
		t.Fatalf("top-level keys not read: %+v", old)
	}
	if got := strings.Join(old.Deprecated, ","); got != "listen,max_payload,max_connections" {
		t.Fatalf("Deprecated = %q", got)
	}
	if notes := old.DeprecationNotes(); len(notes) != 3 || !strings.Contains(notes[0], "nbd.listen") {
		t.Fatalf("DeprecationNotes = %q", notes)
	}

	if _, err := Parse([]byte("listen: [\"127.0.0.1:0\"]\nnbd:\n  listen: [\"127.0.0.1:1\"]\n")); err == nil || !strings.Contains(err.Error(), "listen set both") {
		t.Fatalf("listen in both places: %v", err)
	}

	b, err := old.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if !strings.Contains(s, "\nnbd:\n") || strings.HasPrefix(s, "listen:") || strings.Contains(s, "\nlisten:") || strings.Contains(s, "\nmax_payload:") {
		t.Fatalf("Marshal did not write the nbd: form:\n%s", s)
	}
	back, err := Parse(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	if len(back.Deprecated) != 0 || back.MaxPayload != old.MaxPayload || back.MaxConnections != 7 || len(back.Listen) != 1 || back.TLS != old.TLS {
		t.Fatalf("round trip: %+v\n%s", back, s)
	}
}
