package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
)

// TestNoSpaceReported runs the real daemon on a 32 MiB filesystem with a
// 256 MiB thin volume and writes into it with qemu-io until the
// filesystem is full. The guest's writes then fail with ENOSPC; the
// operator must hear about it at once: a WARN line naming the volume and
// the free space (rate-limited: not one per failed request), the volume's
// ENOSPC count and last time in `vmsan status` (text and JSON), and a
// no-space event, both in the live stream and in `vmsan events --now`.
func TestNoSpaceReported(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	mnt := testutil.LoopMount(t, "mkfs.ext4", 32<<20, "-q", "-F", "-m", "0")
	bin := buildBinary(t)
	dir := filepath.Join(mnt, "data")
	if out, err := exec.Command(bin, "volume", "create", "vm1", "--size", "256M", "--data-dir", dir).CombinedOutput(); err != nil {
		t.Fatalf("volume create: %v\n%s", err, out)
	}
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	var stderr syncBuffer
	srv := exec.Command(bin, "serve", "--data-dir", dir, "--listen", "unix:"+sock, "--log-level", "info")
	srv.Stderr = &stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		srv.Process.Kill()
		<-exited
	})
	waitFor(t, "the control socket", func() bool {
		c, err := Dial(dir)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// A live event subscriber, started before the writes.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ev := exec.CommandContext(ctx, bin, "events", "--data-dir", dir)
	evOut, err := ev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); ev.Wait() }()
	lines := make(chan string, 256)
	go func() {
		sc := bufio.NewScanner(evOut)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	for l := range lines {
		if l == "exists -" {
			break
		}
	}

	// 64 MiB of 1 MiB writes into a 32 MiB filesystem: the later ones fail.
	start := time.Now()
	args := []string{"-f", "raw"}
	for i := 0; i < 64; i++ {
		args = append(args, "-c", "write -P 0x5a "+itoa(i<<20)+" 1M")
	}
	args = append(args, "nbd+unix:///vm1?socket="+sock)
	qout, _ := exec.Command("qemu-io", args...).CombinedOutput()
	if !strings.Contains(string(qout), "No space left on device") {
		t.Fatalf("qemu-io saw no ENOSPC:\n%s", qout)
	}
	failed := strings.Count(string(qout), "No space left on device")

	// The live event.
	evRE := regexp.MustCompile(`^change no-space volume:vm1 errors:(\d+) last:\S+ fs_free_bytes:(\d+)$`)
	deadline := time.After(15 * time.Second)
	for got := false; !got; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("event stream ended")
			}
			got = evRE.MatchString(l)
		case <-deadline:
			t.Fatal("no no-space change event within 15 s")
		}
	}

	// The WARN line: volume, error count, free space of its filesystem.
	warnRE := regexp.MustCompile(`level=WARN msg="volume out of space[^"]*" volume=vm1 errors=(\d+) (not_logged=\d+ )?fs_free="[0-9.]+ (B|KiB)" fs_size="[0-9.]+ MiB" dir=` + regexp.QuoteMeta(filepath.Join(dir, "volumes")))
	for end := time.Now().Add(15 * time.Second); !warnRE.MatchString(stderr.String()); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no WARN line naming vm1 and the free space; daemon log:\n%s", stderr.String())
		}
	}
	// Rate-limited: qemu-io saw many failed writes (each several failed
	// requests in the engine), the log has one line per 10 s at most (the
	// +2: a line at the start of each interval the run touched).
	nwarn := len(warnRE.FindAllString(stderr.String(), -1))
	if max := 2 + int(time.Since(start)/(10*time.Second)); nwarn > max {
		t.Errorf("%d WARN lines for %d failed writes in %v: not rate-limited", nwarn, failed, time.Since(start))
	}
	t.Logf("%d failed writes, %d WARN lines", failed, nwarn)

	// vmsan status: text and JSON.
	out, err := exec.Command(bin, "status", "--data-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^OUT OF SPACE.*\n.*ENOSPC ERRORS.*\nvm1 +[1-9][0-9]* +\d{4}-\d\d-\d\d `).Match(out) {
		t.Errorf("status does not show the ENOSPC errors:\n%s", out)
	}
	out, err = exec.Command(bin, "status", "--json", "--data-dir", dir).Output()
	if err != nil {
		t.Fatal(err)
	}
	var st Status
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Volumes) != 1 || st.Volumes[0].NoSpace == nil {
		t.Fatalf("status --json: no no_space for vm1:\n%s", out)
	}
	ns := st.Volumes[0].NoSpace
	if ns.Errors < uint64(failed) || ns.Last.Before(start) || ns.FSSizeBytes <= 0 || ns.FSSizeBytes > 32<<20 || ns.FSFreeBytes > 1<<20 {
		t.Errorf("no_space %+v after %d failed writes", ns, failed)
	}
	if e := st.Volumes[0].Engine; e == nil || e.Raw.NoSpaceErrors != ns.Errors {
		t.Errorf("engine counts %v ENOSPC errors, no_space %d", e, ns.Errors)
	}

	// vmsan events --now lists it with the current state.
	out, err = exec.Command(bin, "events", "--now", "--data-dir", dir).CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^exists no-space volume:vm1 errors:[1-9]\d* last:\S+ fs_free_bytes:\d+$`).Match(out) {
		t.Errorf("events --now: %v\n%s", err, out)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
