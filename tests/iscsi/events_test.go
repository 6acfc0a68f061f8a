package iscsi

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSessionEvents: an iSCSI login and logout (iscsi-inq) show in `vmsan
// events` as a client created and destroyed, with the front end, volume,
// address and (on destroy) duration, and in the daemon's log as the same
// "client connected" / "client disconnected" lines NBD clients get.
func TestSessionEvents(t *testing.T) {
	t.Parallel()
	v := startVmsan(t, "")
	ev := exec.Command(vmsanBin, "events", "--data-dir", filepath.Join(v.dir, "data"))
	stdout, err := ev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { ev.Process.Kill(); ev.Wait() }()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	wait := func(re string) string {
		t.Helper()
		rx := regexp.MustCompile(re)
		timeout := time.After(30 * time.Second)
		var seen []string
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("event stream ended waiting for %q; saw:\n%s", re, strings.Join(seen, "\n"))
				}
				if rx.MatchString(l) {
					return l
				}
				seen = append(seen, l)
			case <-timeout:
				t.Fatalf("no event matching %q; saw:\n%s\nlog:\n%s", re, strings.Join(seen, "\n"), v.logTail())
			}
		}
	}
	wait(`^exists -$`) // subscribed: the snapshot is out, changes follow
	if out, err := run(t, 30*time.Second, "iscsi-inq", v.url("", 0)); err != nil || !strings.Contains(out, "VMSAN") {
		t.Fatalf("iscsi-inq: %v\n%s", err, out)
	}
	created := wait(`^create client id:(\d+) front_end:iscsi volume:disk remote:127\.0\.0\.1:\d+ since:\S+$`)
	id := regexp.MustCompile(`id:(\d+)`).FindStringSubmatch(created)[1]
	wait(`^destroy client id:` + id + ` front_end:iscsi volume:disk remote:127\.0\.0\.1:\d+ duration:\S+$`)
	// The log lines precede the events (the daemon logs, then publishes).
	b, err := os.ReadFile(filepath.Join(v.dir, "vmsan.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, re := range []string{
		`msg="client connected" front_end=iscsi volume=disk remote=127\.0\.0\.1:\d+`,
		`msg="client disconnected" front_end=iscsi volume=disk remote=127\.0\.0\.1:\d+ duration=\S+`,
	} {
		if !regexp.MustCompile(re).Match(b) {
			t.Errorf("log lacks %q:\n%s", re, v.logTail())
		}
	}
}
