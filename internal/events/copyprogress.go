package events

import (
	"strconv"
	"time"
)

// Progress of a full copy (snapshot, clone or rollback with --copy) made
// by the daemon: the copy runs inside a control request, so the client
// learns how far it is from "copy" events on the event stream
// (control.FollowCopy), published at most every copyEventPeriod and once
// at the end.

const copyEventPeriod = 500 * time.Millisecond

// CopyProgress returns the sparse copy's Progress callback for a copy of
// size bytes into target ("VOL@SNAP" or a volume name) from vol,
// publishing on bus.
func CopyProgress(bus *Bus, vol, target string, size int64) func(done int64) {
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
		bus.Publish(New(Change, Copy, "volume", vol, "target", target,
			"done_bytes", strconv.FormatInt(done, 10), "total_bytes", strconv.FormatInt(size, 10),
			"percent", strconv.FormatFloat(pct, 'f', 1, 64)))
	}
}
