package daemon

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/volume"
)

// TestDeleteNeverWhileHeld hammers registry.Open/Release from several
// goroutines while another deletes the volume without force. The invariant
// (vol.go): a non-forced delete never succeeds while a device is held. If it
// did, a holder's next request would fail with errVolumeGone.
func TestDeleteNeverWhileHeld(t *testing.T) {
	dir := t.TempDir()
	r := start(t, dir, func(c *config.Config) {
		c.NoDefaultVolume = true
		c.Listen = []string{"127.0.0.1:0"}
	})
	reg := registry{r.d}
	const rounds = 20
	var deletes, violations, opens atomic.Int64
	for round := 0; round < rounds; round++ {
		if _, err := r.d.vo.CreateVolume(volume.CreateOptions{Name: "v", Size: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		opens.Store(0)
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 4096)
				done := make(chan error, 1)
				for {
					select {
					case <-stop:
						return
					default:
					}
					dev, err := reg.Open("v")
					if err != nil {
						if !errors.Is(err, export.ErrNotFound) {
							t.Error(err)
						}
						time.Sleep(50 * time.Microsecond)
						continue
					}
					opens.Add(1)
					// Two requests with a pause between them: a delete that
					// wrongly succeeds while the device is held makes the
					// second (at least) fail.
					for i := 0; i < 2; i++ {
						dev.Submit(&export.Request{Op: export.OpRead, Length: 4096, Data: buf, Done: func(q *export.Request) { done <- q.Err }})
						if err := <-done; errors.Is(err, errVolumeGone) {
							violations.Add(1)
						}
						time.Sleep(100 * time.Microsecond)
					}
					dev.Release()
				}
			}()
		}
		waitFor(t, "holders to be active", func() bool { return opens.Load() >= 20 })
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			err := r.d.vo.DeleteVolume("v", false)
			if err == nil {
				deletes.Add(1)
				break
			}
			if !errors.Is(err, volume.ErrInUse) {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Microsecond)
		}
		close(stop)
		wg.Wait()
		if _, err := r.d.store.Get("v"); err == nil {
			r.d.vo.DeleteVolume("v", true) // the deleter lost every race this round
		}
	}
	if violations.Load() > 0 {
		t.Fatalf("%d requests saw the volume deleted while they held it", violations.Load())
	}
	if deletes.Load() == 0 {
		t.Fatal("no non-forced delete ever succeeded; the test proved nothing")
	}
	t.Logf("%d/%d rounds deleted without force under contention", deletes.Load(), rounds)
}
