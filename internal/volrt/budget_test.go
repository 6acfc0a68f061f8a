package volrt

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBudgetSharedParentCap: many child budgets (one per connection), each
// with a limit larger than its share, reserve and release concurrently from
// one parent; the parent's use never exceeds its limit, every reservation
// eventually succeeds (no deadlock), and everything is given back.
func TestBudgetSharedParentCap(t *testing.T) {
	const (
		total    = 1000
		children = 16
		rounds   = 1000
	)
	var parent Budget
	parent.Init(total)
	var peak atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{}) // all children contend from the start
	for i := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var c Budget
			c.InitChild(400, &parent) // 16 x 400 would be 6400 without the parent
			r := rand.New(rand.NewPCG(uint64(i), 1))
			var held []int64
			for range rounds {
				if len(held) > 0 && (r.IntN(2) == 0 || len(held) > 3) {
					c.Release(held[0])
					held = held[1:]
					continue
				}
				n := int64(1 + r.IntN(total)) // up to the whole parent
				if r.IntN(4) == 0 {
					if !c.TryReserve(n) {
						continue
					}
				} else {
					// Waiting while holding could deadlock against other
					// holders; a front end's reader holds nothing the
					// others wait for, so give back first, as it does.
					for _, h := range held {
						c.Release(h)
					}
					held = held[:0]
					c.Reserve(n)
				}
				held = append(held, n)
				runtime.Gosched() // hold it while others run
				if u := parent.Used(); u > peak.Load() {
					peak.Store(u)
				}
				if u := parent.Used(); u > total {
					t.Errorf("parent holds %d > limit %d", u, total)
				}
			}
			for _, h := range held {
				c.Release(h)
			}
			if u := c.Used(); u != 0 {
				t.Errorf("child still holds %d", u)
			}
		}()
	}
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("deadlock: reservations still waiting after 30s")
	}
	if u := parent.Used(); u != 0 {
		t.Errorf("parent still holds %d after every child released", u)
	}
	st := parent.Stats()
	t.Logf("peak %d of %d; parent waits %d, refused %d", peak.Load(), total, st.Waits, st.Refused)
	if st.Waits+st.Refused == 0 {
		t.Error("no reservation ever waited for or was refused by the parent: the test did not exercise the shared cap")
	}
}

// TestBudgetParentBlocksChild: a child below its own limit still waits
// while the parent is full, and TryReserve refuses.
func TestBudgetParentBlocksChild(t *testing.T) {
	var p, a, b Budget
	p.Init(100)
	a.InitChild(100, &p)
	b.InitChild(100, &p)
	a.Reserve(80)
	if b.TryReserve(30) {
		t.Fatal("TryReserve took 30 with 80 of 100 held in the parent")
	}
	if b.Used() != 0 || p.Used() != 80 {
		t.Fatalf("failed TryReserve left child %d, parent %d held", b.Used(), p.Used())
	}
	got := make(chan struct{})
	go func() { b.Reserve(30); close(got) }()
	select {
	case <-got:
		t.Fatal("child reserved past the parent's limit")
	case <-time.After(50 * time.Millisecond):
	}
	a.Release(80)
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("child reservation not admitted after the parent freed")
	}
	if p.Used() != 30 || p.Stats().Waits == 0 || p.Stats().Refused == 0 {
		t.Fatalf("parent %+v, want 30 used with a wait and a refusal counted", p.Stats())
	}
}

// TestBudgetFIFO: a large reservation waiting for room is not overtaken by
// later small ones (which would fit) and so is not starved.
func TestBudgetFIFO(t *testing.T) {
	var b Budget
	b.Init(100)
	b.Reserve(60)
	big := make(chan struct{})
	go func() { b.Reserve(90); close(big) }()
	for b.Stats().Waits == 0 {
		time.Sleep(time.Millisecond)
	}
	if b.TryReserve(10) {
		t.Fatal("TryReserve overtook a waiting reservation")
	}
	small := make(chan struct{})
	go func() { b.Reserve(10); close(small) }()
	select {
	case <-small:
		t.Fatal("a later small Reserve overtook the waiting large one")
	case <-time.After(50 * time.Millisecond):
	}
	b.Release(60)
	<-big
	b.Release(90)
	<-small
}

// TestBudgetReserveWaiting: beforeWait runs only when the reservation has
// to wait, before it waits, and a release meanwhile is not missed.
func TestBudgetReserveWaiting(t *testing.T) {
	var b Budget
	b.Init(100)
	calls := 0
	b.ReserveWaiting(60, func() { calls++ })
	if calls != 0 {
		t.Fatalf("beforeWait called %d times for a reservation that fit", calls)
	}
	done := make(chan struct{})
	go func() {
		// Released while beforeWait runs: the reservation must still
		// proceed (no lost wake-up).
		b.ReserveWaiting(60, func() { calls++; b.Release(60) })
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("reservation missed the release made during beforeWait")
	}
	if calls != 1 || b.Used() != 60 {
		t.Fatalf("beforeWait calls %d, used %d; want 1, 60", calls, b.Used())
	}
}
