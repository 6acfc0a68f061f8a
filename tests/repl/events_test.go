package repl_test

import (
	"bufio"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestEventsReplication: `vmsan events` on the primary of a real pair
// shows the replication state as an "exists" line, then the connection
// change when the secondary dies, and `--now` exits after the snapshot.
func TestEventsReplication(t *testing.T) {
	p := newPair(t, pairOpts{})
	out, err := p.a.vmsanOut("events", "--now")
	if err != nil {
		t.Fatalf("events --now: %v\n%s", err, out)
	}
	re := regexp.MustCompile(`(?m)^exists replication volume:vm1 role:Primary disk:UpToDate connection:Connected peer_role:Secondary peer_disk:UpToDate out_of_sync_bytes:0$`)
	if !re.MatchString(out) || !strings.HasSuffix(out, "exists -\n") {
		t.Fatalf("events --now printed:\n%s", out)
	}

	cmd := exec.Command(vmsanBin, "events", "--data-dir", p.a.dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	wait := func(re string) {
		t.Helper()
		rx := regexp.MustCompile(re)
		timeout := time.After(30 * time.Second)
		var seen []string
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("stream ended waiting for %q; saw:\n%s", re, strings.Join(seen, "\n"))
				}
				if rx.MatchString(l) {
					return
				}
				seen = append(seen, l)
			case <-timeout:
				t.Fatalf("no line matching %q; saw:\n%s", re, strings.Join(seen, "\n"))
			}
		}
	}
	wait(`^exists -$`)
	p.b.kill9()
	wait(`^change replication volume:vm1 role:Primary disk:UpToDate connection:(Connecting|Handshake|StandAlone|Disconnecting) `)
}
