package control

import (
	"bufio"
	"context"
	"encoding/json"
	"strconv"
	"sync"

	"github.com/vmsan/vmsan/internal/events"
)

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
