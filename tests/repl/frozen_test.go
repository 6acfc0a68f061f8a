package repl_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/nbd/client"
)

// verifyingWriter writes through a real NBD connection from several
// goroutines, each owning its own blocks, and records every acknowledged
// write (the last acknowledged content of each block), its latency and its
// completion time.
type verifyingWriter struct {
	c       *client.Conn
	workers int
	blocks  int   // per worker
	bs      int64 // block size

	mu      sync.Mutex
	last    map[int64]uint64 // block offset -> last acknowledged stamp
	lat     []time.Duration
	startAt []time.Time
	doneAt  []time.Time
	slowest time.Duration
	slowAt  time.Time
	errs    []error
	stop    chan struct{}
	wg      sync.WaitGroup
}

func stampBlock(stamp uint64, bs int64) []byte {
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], stamp)
	return bytes.Repeat(w[:], int(bs/8))
}

func (v *verifyingWriter) start() {
	v.last = map[int64]uint64{}
	v.stop = make(chan struct{})
	for w := 0; w < v.workers; w++ {
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			for seq := uint64(1); ; seq++ {
				select {
				case <-v.stop:
					return
				default:
				}
				blk := int64(w*v.blocks) + int64(seq)%int64(v.blocks)
				off := blk * v.bs
				stamp := uint64(w+1)<<48 | seq
				t0 := time.Now()
				_, err := v.c.WriteAt(stampBlock(stamp, v.bs), off)
				d := time.Since(t0)
				v.mu.Lock()
				if err != nil {
					v.errs = append(v.errs, fmt.Errorf("write %d at %d: %w", stamp, off, err))
					v.mu.Unlock()
					return
				}
				v.last[off] = stamp
				v.lat = append(v.lat, d)
				v.startAt = append(v.startAt, t0)
				v.doneAt = append(v.doneAt, time.Now())
				if d > v.slowest {
					v.slowest, v.slowAt = d, t0
				}
				v.mu.Unlock()
			}
		}()
	}
}

func (v *verifyingWriter) halt() {
	close(v.stop)
	v.wg.Wait()
}

// slowestFrom returns the slowest write started in [from, to).
func (v *verifyingWriter) slowestFrom(from, to time.Time) time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	var m time.Duration
	for i, t := range v.startAt {
		if !t.Before(from) && t.Before(to) {
			m = max(m, v.lat[i])
		}
	}
	return m
}

// count returns the writes completed in [from, to).
func (v *verifyingWriter) count(from, to time.Time) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, t := range v.doneAt {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return n
}

// check reads every written block back through c and compares it with the
// last acknowledged content.
func (v *verifyingWriter) check(t *testing.T, c *client.Conn) {
	t.Helper()
	buf := make([]byte, v.bs)
	for off, stamp := range v.last {
		if _, err := c.ReadAt(buf, off); err != nil {
			t.Fatalf("read back %d: %v", off, err)
		}
		if !bytes.Equal(buf, stampBlock(stamp, v.bs)) {
			t.Fatalf("block at %d: acknowledged write %x lost (reads %x)", off, stamp, binary.LittleEndian.Uint64(buf))
		}
	}
}

// The replicated small-write failure mode: the secondary is frozen (SIGSTOP) while a
// client writes through the primary. Its kernel still accepts TCP
// connections, so every redial ends in a handshake that never completes.
// The primary must stop waiting for it after the ping timeout and run at
// local speed (writes never wait for a handshake), then resync once the
// secondary thaws: no acknowledged write lost, replicas byte-equal.
//
// Bounds: ping timeout 2 s (tick 20 ms, ping every 100 ms). A write in
// flight at the freeze waits for the peer's ack until the ping timeout
// declares it dead, so the slowest write may take up to 2 s plus a tick;
// the target is ping timeout + 1 s; on top we allow 1 s for a
// loaded CI host (scheduling delays of the loop, the client and the
// metadata fdatasync at the disconnect), so the bound is 4 s. Without the
// fix the writes stall for the whole 20 s freeze.
func TestFrozenSecondaryDoesNotStallPrimary(t *testing.T) {
	const pingTimeout = 2 * time.Second
	freeze := 20 * time.Second
	if os.Getenv("VMSAN_SOAK") == "1" {
		freeze = 30 * time.Second
	}
	p := newPair(t, pairOpts{size: "64M", extra: []string{"--ping-timeout", "100", "--ko-ticks", "500"}})
	stopped := false
	t.Cleanup(func() {
		if stopped {
			p.b.cmd.Process.Signal(syscall.SIGCONT)
		}
	})
	ctx := context.Background()
	c, err := client.Dial(ctx, p.a.uri(), &client.Options{Connections: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v := &verifyingWriter{c: c, workers: 8, blocks: 64, bs: 64 << 10}
	v.start()
	defer func() {
		select {
		case <-v.stop:
		default:
			v.halt()
		}
	}()

	// Baseline: the primary standalone (replication administratively
	// disconnected), then reconnected and resynced.
	time.Sleep(time.Second)
	if err := p.a.admin("disconnect"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	b0 := time.Now()
	time.Sleep(3 * time.Second)
	standalone := float64(v.count(b0, time.Now())) / 3
	if err := p.a.admin("connect"); err != nil {
		t.Fatal(err)
	}
	p.waitSynced(t, 60*time.Second)
	time.Sleep(time.Second)
	c0 := time.Now()
	time.Sleep(2 * time.Second)
	connected := float64(v.count(c0, time.Now())) / 2

	// Freeze the secondary.
	v.mu.Lock()
	v.slowest = 0
	v.mu.Unlock()
	if err := p.b.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped = true
	tStop := time.Now()
	time.Sleep(freeze)
	p.b.cmd.Process.Signal(syscall.SIGCONT)
	stopped = false
	tCont := time.Now()
	// Keep writing through the secondary's return and resync.
	time.Sleep(3 * time.Second)
	p.waitSynced(t, 60*time.Second)
	v.halt()
	tEnd := time.Now()

	if len(v.errs) > 0 {
		t.Fatalf("client errors: %v", v.errs)
	}
	// Throughput per second across the freeze.
	var buckets []string
	for s := tStop; s.Before(tEnd); s = s.Add(time.Second) {
		buckets = append(buckets, fmt.Sprint(v.count(s, s.Add(time.Second))))
	}
	afterTimeout := tStop.Add(pingTimeout + 2*time.Second)
	frozenRate := float64(v.count(afterTimeout, tCont)) / tCont.Sub(afterTimeout).Seconds()
	// Once the peer was declared dead, later writes never wait for it
	// again, although every redial reaches a handshake it never answers.
	laterSlowest := v.slowestFrom(tStop.Add(pingTimeout+500*time.Millisecond), tCont)
	lat := append([]time.Duration(nil), v.lat...)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sa := p.a.status()
	t.Logf("64 KiB writes, 8 in flight: standalone %.0f/s, connected %.0f/s, frozen peer (from ping timeout + 2 s to thaw) %.0f/s = %.0f%% of standalone",
		standalone, connected, frozenRate, 100*frozenRate/standalone)
	t.Logf("writes per second from the freeze (%v) on: %v", freeze, buckets)
	t.Logf("slowest write started after the ping timeout and before the thaw: %v", laterSlowest)
	t.Logf("slowest write during and after the freeze %v (started %v after SIGSTOP); p50 %v p99 %v over the whole run; disconnects %d, last error %q",
		v.slowest.Round(time.Millisecond), v.slowAt.Sub(tStop).Round(time.Millisecond), lat[len(lat)/2].Round(time.Microsecond), lat[len(lat)*99/100].Round(time.Millisecond), sa.Disconnects, sa.LastError)

	if bound := pingTimeout + 2*time.Second; v.slowest > bound {
		t.Errorf("slowest write %v > ping timeout + 1 s + 1 s slack (%v)", v.slowest, bound)
	}
	// A handshake lasts up to the ping timeout (2 s) before it is
	// abandoned; writes held by it would show here. 1.5 s: room for a
	// loaded host (seen up to 0.7 s: the loop persists metadata with
	// fdatasync at every disconnect, on a disk shared with other jobs),
	// still clearly below the 2 s a held write waits.
	if laterSlowest > 1500*time.Millisecond {
		t.Errorf("a write started after the peer was declared dead took %v: writes still wait for the frozen peer (handshake?)", laterSlowest)
	}
	// The target is 80% of standalone. Measured on a shared 2-core
	// CI host the two rates come from different seconds, so the assertion
	// leaves room for load noise; the figures above are the measurement.
	if frozenRate < 0.5*standalone {
		t.Errorf("with the peer frozen the primary wrote %.0f/s, under half of standalone (%.0f/s)", frozenRate, standalone)
	}
	// No acknowledged write lost, and the replicas converged.
	v.check(t, c)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	p.waitSynced(t, 30*time.Second)
	if p.a.rawSum() != p.b.rawSum() {
		t.Fatal("backing files differ after the secondary thawed and resynced")
	}
}

// Issue 7 item 1: kill -9 of the secondary under a deep queue (fio, 16
// writes in flight, protocol C) and leave it down. Every write pending at
// the disconnect must be answered (and marked out of sync): fio finishes
// without error, and the primary's SIGTERM drain is quick. Before the fix
// every other pending write was skipped at the disconnect and never
// answered: fio hung and so did the drain.
func TestKillSecondaryAtDepthAllWritesAnswered(t *testing.T) {
	need(t, "fio")
	p := newPair(t, pairOpts{protocol: "C"})
	// fio runs 5 s; 30 s is far beyond its end plus the 0.5 s ping timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fio := exec.CommandContext(ctx, "fio", "--name=qd16", "--ioengine=nbd", "--uri="+p.a.uri(), "--rw=randwrite", "--bs=4k",
		"--iodepth=32", "--size=32M", "--time_based", "--runtime=5", "--numjobs=1", "--output-format=terse")
	var out bytes.Buffer
	fio.Stdout, fio.Stderr = &out, &out
	fio.WaitDelay = 5 * time.Second // fio's job process may outlive a killed parent
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	// The secondary's host goes away: its address refuses connections
	// from now on, as a dead host's does. (Through a live proxy every
	// redial would reach a handshake that fails at once, and each such
	// disconnect released some more of the writes the first one skipped,
	// hiding the defect; so the proxy goes first, then the process.)
	p.px.Close()
	p.b.kill9()
	tKill := time.Now()
	err := fio.Wait()
	if ctx.Err() != nil {
		t.Fatalf("fio still waiting for writes %v after the secondary died (writes left unanswered):\n%s", time.Since(tKill).Round(time.Second), out.String())
	}
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, out.String())
	}
	st := p.a.status()
	t.Logf("fio finished %v after the kill; primary %s, %d B out of sync", time.Since(tKill).Round(time.Millisecond), st.Conn, st.OutOfSync)
	if st.OutOfSync == 0 {
		t.Fatal("writes made after the secondary died are not marked out of sync")
	}
	t0 := time.Now()
	p.a.stop()
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("SIGTERM drain took %v", d)
	} else {
		t.Logf("SIGTERM drain %v", d.Round(time.Millisecond))
	}
}
