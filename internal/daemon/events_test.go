package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// lineReader delivers a stream's lines on a channel so a test can wait for
// one with a deadline.
func lineReader(body io.Reader) <-chan string {
	ch := make(chan string, 100)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// expectLine waits for a line matching re, skipping others; it returns the
// line, or fails when the stream ends or nothing matches within 30s.
func expectLine(t *testing.T, lines <-chan string, re string) string {
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
				return l
			}
			seen = append(seen, l)
		case <-timeout:
			t.Fatalf("no line matching %q; saw:\n%s", re, strings.Join(seen, "\n"))
		}
	}
}

// TestEventsStream: a subscriber gets the current state ("exists" lines
// ending with "exists -"), then volume create/resize/delete and an NBD
// client's connect and disconnect as they happen; the daemon logs each
// client's connect and disconnect with its address and duration; --now
// stops after the snapshot; shutdown ends an open stream at once.
func TestEventsStream(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	logs := &syncBuffer{}
	r := startOpts(t, t.TempDir(), nil, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	c := NewClient(r.d.ControlPath())
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body, err := c.Events(ctx, false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	lines := lineReader(body)
	expectLine(t, lines, `^exists volume name:default size:10737418240 cache:writeback read_only:false$`)
	expectLine(t, lines, `^exists -$`)

	if _, err := r.d.vo.CreateVolume(volume.CreateOptions{Name: "vm2", Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	expectLine(t, lines, `^create volume name:vm2 size:1048576 `)
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x5a 0 4096", r.url("vm2"))
	l := expectLine(t, lines, `^create client id:\d+ front_end:nbd volume:vm2 remote:127\.0\.0\.1:\d+ since:\S+$`)
	id := regexp.MustCompile(`id:(\d+)`).FindStringSubmatch(l)[1]
	expectLine(t, lines, `^destroy client id:`+id+` front_end:nbd volume:vm2 remote:127\.0\.0\.1:\d+ duration:\S+$`)
	if _, err := r.d.vo.ResizeVolume("vm2", 2<<20, false); err != nil {
		t.Fatal(err)
	}
	expectLine(t, lines, `^change volume name:vm2 size:2097152 `)
	if err := r.d.vo.DeleteVolume("vm2", false); err != nil {
		t.Fatal(err)
	}
	expectLine(t, lines, `^destroy volume name:vm2$`)

	// The log names the client on connect and on disconnect, with the
	// duration (wait for the disconnect line: the server goroutine logs it
	// as the connection winds down).
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(logs.String(), `msg="client disconnected"`); {
		if time.Now().After(deadline) {
			t.Fatalf("no disconnect log line:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, re := range []string{
		`msg="client connected" front_end=nbd volume=vm2 remote=127\.0\.0\.1:\d+`,
		`msg="client disconnected" front_end=nbd volume=vm2 remote=127\.0\.0\.1:\d+ duration=\d`,
	} {
		if !regexp.MustCompile(re).MatchString(logs.String()) {
			t.Errorf("log lacks %q:\n%s", re, logs.String())
		}
	}

	// --now (JSON): the snapshot, then the stream ends.
	nb, err := c.Events(ctx, true, true)
	if err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(nb)
	nb.Close()
	if err != nil {
		t.Fatal(err)
	}
	jl := strings.Split(strings.TrimSpace(string(all)), "\n")
	var first, lastEv map[string]string
	if len(jl) != 2 || json.Unmarshal([]byte(jl[0]), &first) != nil || json.Unmarshal([]byte(jl[1]), &lastEv) != nil ||
		first["kind"] != "exists" || first["object"] != "volume" || first["name"] != "default" || lastEv["object"] != "-" {
		t.Fatalf("--now --json gave:\n%s", all)
	}

	// Shutdown ends the open stream promptly (not after the drain timeout).
	t0 := time.Now()
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	for range lines {
	}
	if el := time.Since(t0); el > 15*time.Second {
		t.Errorf("shutdown with an open event stream took %v", el)
	}
}

// TestEventsSlowReaderDropped: a subscriber that stops reading is dropped
// once its queue is full, without slowing the publisher, and its stream
// ends with an "overflow" line after what it had been sent.
func TestEventsSlowReaderDropped(t *testing.T) {
	r := start(t, t.TempDir(), nil)
	c := NewClient(r.d.ControlPath())
	defer c.Close()
	body, err := c.Events(context.Background(), false, false)
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	br := bufio.NewReader(body)
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if l == "exists -\n" {
			break
		}
	}
	// Not reading: socket buffers fill, the handler blocks in Write, its
	// queue fills and the bus drops it. Publish must not block meanwhile.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 200000; i++ {
			r.d.events.Publish(events.New(events.Change, events.Volume, "name", "filler", "i", strconv.Itoa(i)))
		}
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Publish blocked on a subscriber that does not read")
	}
	last, n := "", 0
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			break
		}
		last, n = strings.TrimSpace(l), n+1
	}
	if last != "overflow" || n >= 200000 {
		t.Fatalf("read %d lines after the snapshot, last %q; want fewer than were published, then overflow", n, last)
	}
	if n := r.d.events.Subscribers(); n != 0 {
		t.Fatalf("%d subscribers left", n)
	}
}
