package daemon

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// TestSoakDaemon (make soak; VMSAN_SOAK=1, VMSAN_SOAK_DURATION=10m) runs a
// verifying fio workload over NBD while the control plane is exercised
// constantly: status and metrics scrapes, scratch volumes created, grown and
// deleted, settings changed. fio's crc32c verify catches any corruption; the
// daemon must then shut down cleanly.
func TestSoakDaemon(t *testing.T) {
	if os.Getenv("VMSAN_SOAK") == "" {
		t.Skip("soak test: set VMSAN_SOAK=1 (make soak)") // skip: soak
	}
	testutil.NeedTool(t, "fio")
	dur := 5 * time.Minute
	if s := os.Getenv("VMSAN_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		dur = d
	}
	dir := t.TempDir()
	r := start(t, dir, func(c *config.Config) {
		c.NoDefaultVolume = true
		c.Volumes = []config.Volume{{Name: "soak", Size: 1 << 30}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), dur+2*time.Minute)
	defer cancel()
	fio := exec.CommandContext(ctx, "fio", "--name=soak", "--ioengine=nbd", "--uri="+r.url("soak"),
		// One job: two jobs on one NBD export would overwrite each other's
		// verify headers. verify_backlog checks data while writing, since a
		// time-based job never reaches a final verify pass.
		"--rw=randwrite", "--bsrange=4k-128k", "--iodepth=32", "--size=512m",
		"--time_based", fmt.Sprintf("--runtime=%ds", int(dur.Seconds())),
		"--verify=crc32c", "--verify_fatal=1", "--verify_backlog=256", "--verify_state_save=0")
	fio.Dir = t.TempDir() // fio drops state files in its working directory
	var wg sync.WaitGroup
	var cycles int
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // the control plane, continuously
		defer wg.Done()
		c, err := Dial(dir)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		yes := true
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("scratch%d", i%4)
			if _, err := c.Create(volume.CreateOptions{Name: name, Size: 64 << 20}); err != nil {
				t.Errorf("create %s: %v", name, err)
				return
			}
			if _, err := c.Resize(name, 128<<20, false); err != nil {
				t.Errorf("resize %s: %v", name, err)
			}
			if _, err := c.Update(name, Settings{Rotational: &yes}); err != nil {
				t.Errorf("update %s: %v", name, err)
			}
			if _, err := c.Status(); err != nil {
				t.Errorf("status: %v", err)
			}
			if err := c.Delete(name, false); err != nil {
				t.Errorf("delete %s: %v", name, err)
			}
			cycles++
			time.Sleep(50 * time.Millisecond)
		}
	}()
	out, err := fio.CombinedOutput()
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("fio: %v\n%s", err, out)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("shutdown after soak: %v", err)
	}
	if cycles == 0 {
		t.Fatal("the control plane never completed a cycle during the soak")
	}
	t.Logf("%d control-plane cycles during the soak; fio:\n%s", cycles, tail(string(out), 1500))
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
