package events

import (
	"encoding/json"
	"testing"
	"time"
)

func TestFanOutAndText(t *testing.T) {
	b := NewBus()
	s1, s2 := b.Subscribe(4), b.Subscribe(4)
	defer s1.Close()
	defer s2.Close()
	b.Publish(New(Create, Volume, "name", "vm1", "size", "1073741824", "description", "a b"))
	for _, s := range []*Sub{s1, s2} {
		e := <-s.C()
		if got, want := e.String(), `create volume name:vm1 size:1073741824 description:"a b"`; got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
		var m map[string]string
		bj, _ := json.Marshal(e)
		if err := json.Unmarshal(bj, &m); err != nil || m["kind"] != "create" || m["object"] != "volume" || m["name"] != "vm1" || m["time"] == "" {
			t.Fatalf("json %s: %v", bj, err)
		}
	}
}

// TestSlowSubscriberDropped: a subscriber that does not read is dropped
// once its buffer is full, keeps what it had, and Publish never blocks for
// it; the others still get every event.
func TestSlowSubscriberDropped(t *testing.T) {
	b := NewBus()
	slow, fast := b.Subscribe(2), b.Subscribe(100)
	defer fast.Close()
	done := make(chan struct{})
	go func() {
		for i := 0; i < 50; i++ {
			b.Publish(New(Change, Volume, "i", string(rune('a'+i%26))))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a slow subscriber")
	}
	n := 0
	for range slow.C() {
		n++
	}
	if n != 2 || !slow.Overflowed() {
		t.Fatalf("slow subscriber got %d events, overflowed %v; want 2, true", n, slow.Overflowed())
	}
	if len(fast.C()) != 50 || fast.Overflowed() {
		t.Fatalf("fast subscriber has %d events", len(fast.C()))
	}
	if b.Subscribers() != 1 {
		t.Fatalf("%d subscribers left, want 1", b.Subscribers())
	}
	slow.Close() // idempotent after overflow
	var nilBus *Bus
	nilBus.Publish(New(Create, Volume)) // no-op
}
