package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/events"
)

// Progress of a full copy (snapshot, clone or rollback with --copy) made
// by the daemon: the copy runs inside a control request, so the client
// learns how far it is from "copy" events on the event stream
// (Client.FollowCopy), published at most every copyEventPeriod and once
// at the end.

const copyEventPeriod = 500 * time.Millisecond

// copyProgress returns the sparse copy's Progress callback for a copy of
// size bytes into target ("VOL@SNAP" or a volume name) from vol.
func (d *Daemon) copyProgress(vol, target string, size int64) func(done int64) {
	var last time.Time
	return func(done int64) {
		now := time.Now()
		if done < size && now.Sub(last) < copyEventPeriod {
			return
		}
		last = now
		pct := 100.0
		if size > 0 {
			pct = float64(done) * 100 / float64(size)
		}
		d.events.Publish(events.New(events.Change, events.Copy, "volume", vol, "target", target,
			"done_bytes", strconv.FormatInt(done, 10), "total_bytes", strconv.FormatInt(size, 10),
			"percent", strconv.FormatFloat(pct, 'f', 1, 64)))
	}
}

// FollowCopy calls set with the progress of the daemon's copy into target
// (as copy events report it) until stop is called. On an operations value
// that is not a daemon client (no daemon: the copy runs in this process)
// it does nothing.
func FollowCopy(ops any, target string, set func(done, total int64)) (stop func()) {
	c, ok := ops.(*Client)
	if !ok {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	body, err := c.Events(ctx, false, true)
	if err != nil {
		cancel()
		return func() {}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(body)
		for sc.Scan() {
			var e map[string]string
			if json.Unmarshal(sc.Bytes(), &e) != nil || e["object"] != events.Copy || e["target"] != target {
				continue
			}
			done, err1 := strconv.ParseInt(e["done_bytes"], 10, 64)
			total, err2 := strconv.ParseInt(e["total_bytes"], 10, 64)
			if err1 == nil && err2 == nil {
				set(done, total)
			}
		}
	}()
	return func() {
		cancel()
		body.Close()
		wg.Wait()
	}
}
