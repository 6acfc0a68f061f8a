package iscsi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/initiator"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/testutil"
)

// rtpgStates sends REPORT TARGET PORT GROUPS over s (retrying unit
// attentions, which every ALUA change raises) and returns each group's
// asymmetric access state (0 active/optimized, 2 standby, 0xf
// transitioning) by tag.
func rtpgStates(ctx context.Context, s *initiator.Session) (map[uint16]byte, error) {
	cdb := []byte{0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0}
	for range 64 { // unit attentions the changes left pending
		buf := make([]byte, 4096)
		r, err := s.Command(ctx, initiator.EncodeLUN(0), cdb, nil, buf)
		if err != nil {
			return nil, err
		}
		if r.Status == pdu.StatusCheckCondition {
			ce := &initiator.CheckError{Sense: r.Sense}
			if k, _, _ := ce.SenseKey(); k == 6 {
				continue
			}
		}
		if err := initiator.Check(cdb, r, nil); err != nil {
			return nil, err
		}
		b := buf[:r.DataIn]
		if len(b) < 4 {
			return nil, fmt.Errorf("RTPG: %d bytes", len(b))
		}
		out := map[uint16]byte{}
		for b = b[4:]; len(b) >= 8; {
			np := int(b[7])
			if len(b) < 8+4*np {
				return nil, errors.New("RTPG: truncated descriptor")
			}
			out[binary.BigEndian.Uint16(b[2:])] = b[0] & 0x0F
			b = b[8+4*np:]
		}
		return out, nil
	}
	return nil, errors.New("RTPG: unit attentions never end")
}

// TestRoleChangeStorm fires concurrent `vmsan repl promote` and `vmsan
// repl demote` CLIs at one node of a connected pair while an iSCSI
// initiator keeps writing through it. The role controller runs one change
// at a time: every CLI returns (none hangs), each either succeeds or is
// refused as "role change in progress", no write admitted under one role
// reaches the device under the other (no DATA PROTECT: the drain), the
// daemon's front-end role steps never go from changing to changing, every
// change done is logged with the CLI that asked, and once quiet the role
// `repl status` reports is the one the target's REPORT TARGET PORT GROUPS
// and iscsi-inq show.
func TestRoleChangeStorm(t *testing.T) {
	testutil.NeedTool(t, "iscsi-inq")
	a, _ := startISCSIPair(t)

	s, lu := dialGo(t, a.iscsi, initiator.Config{InitiatorName: "iqn.2026-11.org.vmsan:storm", TargetName: nodeIQN + ":disk"})

	// The writer: NOT READY (standby 04/0B, transitioning 04/0A) is the
	// answer to expect while the role is not primary; anything else that
	// fails is a write that met the wrong role.
	stop := make(chan struct{})
	var writes, notReady atomic.Int64
	var wrongMu sync.Mutex
	var wrong []string
	var wwg sync.WaitGroup
	wwg.Add(1)
	go func() {
		defer wwg.Done()
		buf := make([]byte, 64<<10)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			_, err := lu.WriteAtContext(ctx, buf, int64(i%64)*int64(len(buf)), false)
			cancel()
			var ce *initiator.CheckError
			switch {
			case err == nil:
				writes.Add(1)
			case errors.As(err, &ce):
				if k, asc, _ := ce.SenseKey(); k == 2 && asc == 0x04 {
					notReady.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				fallthrough
			default:
				wrongMu.Lock()
				wrong = append(wrong, err.Error())
				wrongMu.Unlock()
				return
			}
		}
	}()

	// The storm: rounds of concurrent CLIs, half promote, half demote.
	const rounds, perRound = 4, 8
	var ok, busy atomic.Int32
	var fails []string
	var fmu sync.Mutex
	for round := range rounds {
		var wg sync.WaitGroup
		for i := range perRound {
			op := "promote"
			if (round+i)%2 == 1 {
				op = "demote"
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				out, err := exec.CommandContext(ctx, vmsanBin, "repl", op, "disk", "--data-dir", a.data).CombinedOutput()
				switch {
				case ctx.Err() != nil:
					fmu.Lock()
					fails = append(fails, fmt.Sprintf("%s hung (killed after 60 s): %s", op, out))
					fmu.Unlock()
				case err == nil:
					ok.Add(1)
				case strings.Contains(string(out), "role change in progress"):
					busy.Add(1)
				default:
					fmu.Lock()
					fails = append(fails, fmt.Sprintf("%s: %v: %s", op, err, out))
					fmu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	close(stop)
	wwg.Wait()
	t.Logf("storm: %d changes done, %d refused in progress; writer: %d written, %d NOT READY",
		ok.Load(), busy.Load(), writes.Load(), notReady.Load())
	if len(fails) > 0 {
		t.Fatalf("CLIs failed other than \"role change in progress\":\n%s", strings.Join(fails, "\n"))
	}
	if len(wrong) > 0 {
		t.Fatalf("a write met the wrong role: %v", wrong)
	}
	if ok.Load() == 0 {
		t.Fatal("no change succeeded")
	}
	if err := s.Err(); err != nil {
		t.Fatalf("the iSCSI session failed during the storm: %v", err)
	}

	// Once quiet, one state: repl status, the ALUA states over iSCSI, and
	// iscsi-inq agree.
	role, conn := a.replStatus(t)
	if role != "Primary" && role != "Secondary" {
		t.Fatalf("role %q after the storm", role)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	states, err := rtpgStates(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	own, peer := byte(0), byte(2)
	if role == "Secondary" {
		own, peer = 2, 0
	}
	if states[1] != own || states[2] != peer {
		t.Fatalf("repl status says %s (%s), but RTPG says this node's group %x, the peer's %x (want %x, %x)", role, conn, states[1], states[2], own, peer)
	}
	inq, err := run(t, 30*time.Second, "iscsi-inq", a.url())
	if standby := err != nil && strings.Contains(inq, "0x040b"); standby != (role == "Secondary") {
		t.Fatalf("repl status says %s, iscsi-inq: %v\n%s", role, err, inq)
	}

	// The log: the front ends were told changing, then a settled role,
	// never changing twice in a row; each change done names the CLI.
	lb, err := os.ReadFile(a.p.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	log := string(lb)
	steps := regexp.MustCompile(`volume role for front ends.* role=(\w+)`).FindAllStringSubmatch(log, -1)
	for i := 1; i < len(steps); i++ {
		if steps[i][1] == "changing" && steps[i-1][1] == "changing" {
			t.Fatalf("front ends told changing twice in a row (step %d of %v)", i, steps)
		}
	}
	if n := len(steps); n == 0 || steps[n-1][1] != strings.ToLower(role) {
		t.Fatalf("the front ends were last told %v, repl status says %s", steps[len(steps)-1:], role)
	}
	done := regexp.MustCompile(`role change done.* by="cli pid \d+ uid \d+"`).FindAllString(log, -1)
	if len(done) != int(ok.Load()) {
		t.Fatalf("%d \"role change done\" lines naming the CLI for %d changes done:\n%s", len(done), ok.Load(), a.p.logTail())
	}
}
