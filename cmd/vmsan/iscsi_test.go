package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/target"
	"github.com/vmsan/vmsan/internal/testutil"
)

// multipathParse has multipath-tools' own parser read conf as
// /etc/multipath.conf and returns its complaints about the file. The host
// is not touched: multipath runs in a private mount namespace with a tmpfs
// over /etc (multipath has no option naming another config file, and it
// writes /etc/multipath/bindings). It cannot build maps there (no
// device-mapper), so only the parser's messages count.
func multipathParse(t *testing.T, conf []byte) string {
	t.Helper()
	mp := testutil.NeedTool(t, "multipath")
	un := testutil.NeedTool(t, "unshare")
	testutil.NeedRoot(t, "a private mount namespace (to parse multipath.conf)")
	f := filepath.Join(t.TempDir(), "multipath.conf")
	if err := os.WriteFile(f, conf, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, un, "-m", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs none /etc && cp "$1" /etc/multipath.conf && exec "$2" -v3 -T`, "sh", f, mp).CombinedOutput()
	var bad []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "multipath.conf") && !strings.Contains(l, "reading") {
			bad = append(bad, l)
		}
	}
	if !strings.Contains(string(out), "multipath") {
		t.Fatalf("multipath did not run:\n%s", out)
	}
	return strings.Join(bad, "\n")
}

// TestMultipathConfParses: multipath-tools accepts every keyword and value
// `vmsan iscsi multipath-conf` prints; a broken copy is refused (the check
// can fail).
func TestMultipathConfParses(t *testing.T) {
	var b bytes.Buffer
	writeMultipathConf(&b, multipathOpts{noPathRetry: 30, replacementTimeout: 5, noopInterval: 2, noopTimeout: 2})
	conf := b.String()
	for _, want := range []string{`vendor "VMSAN"`, "path_grouping_policy group_by_prio", "prio alua", `hardware_handler "1 alua"`,
		"path_checker tur", "failback immediate", "no_path_retry 30", "node.session.timeo.replacement_timeout = 5",
		"noop_out_interval = 2", "noop_out_timeout = 2"} {
		if !strings.Contains(conf, want) {
			t.Errorf("multipath-conf lacks %q", want)
		}
	}
	if msg := multipathParse(t, []byte(conf)); msg != "" {
		t.Fatalf("multipath refuses the generated configuration:\n%s\n%s", msg, conf)
	}
	broken := strings.Replace(strings.Replace(conf, "failback immediate", "failback sometimes", 1), "path_checker tur", "path_checkr tur", 1)
	if msg := multipathParse(t, []byte(broken)); !strings.Contains(msg, "failback") || !strings.Contains(msg, "path_checkr") {
		t.Fatalf("multipath did not refuse a broken configuration: %q", msg)
	}
}

// TestMultipathConfFastIOFail: multipathd writes fast_io_fail_tmo into
// each iSCSI session's recovery timeout, overriding open-iscsi's
// replacement_timeout, so the device section must carry the failover
// time asked for with --replacement-timeout, not a fixed 5 s (measured in
// a guest: replacement_timeout 2 with fast_io_fail_tmo 5 still stalled
// writes 5.5 s on a path loss; docs/iscsi.md "Measured").
func TestMultipathConfFastIOFail(t *testing.T) {
	for _, rt := range []int{2, 5, 9} {
		var b bytes.Buffer
		writeMultipathConf(&b, multipathOpts{noPathRetry: 30, replacementTimeout: rt, noopInterval: 1, noopTimeout: 1})
		out := b.String()
		if want := fmt.Sprintf("\t\tfast_io_fail_tmo %d\n", rt); !strings.Contains(out, want) {
			t.Errorf("--replacement-timeout %d: no %q in\n%s", rt, strings.TrimSpace(want), out)
		}
		if want := fmt.Sprintf("replacement_timeout = %d\n", rt); !strings.Contains(out, want) {
			t.Errorf("--replacement-timeout %d: no %q in\n%s", rt, strings.TrimSpace(want), out)
		}
	}
}

// TestMultipathConfDefaultsMeetTarget: with the recommended timers a lost
// path's I/O moves to another path within 5 s even when the loss is
// silent (NOP-Out interval + timeout, then fast_io_fail_tmo). The guest
// tests (tests/iscsiguest) run with exactly these values and measure it.
func TestMultipathConfDefaultsMeetTarget(t *testing.T) {
	o := defaultMultipathOpts
	if worst := o.noopInterval + o.noopTimeout + o.replacementTimeout; worst > 5 {
		t.Errorf("recommended timers fail a silent path over after up to %d s, want at most 5", worst)
	}
	if o.noPathRetry*5 < 60 {
		t.Errorf("no_path_retry %d queues only %d s at the default polling interval: too short for a promote", o.noPathRetry, o.noPathRetry*5)
	}
}

// TestMultipathConfTargetNopBound: the printed bound on the target's NOP
// timers is the one the daemon warns against, and vmsan's defaults are
// inside it: a silent path is closed by the target before the host can
// resend its I/O elsewhere (tests/iscsi TestStaleWriteAfterFailover).
func TestMultipathConfTargetNopBound(t *testing.T) {
	o := defaultMultipathOpts
	if got := o.targetNopLimit(); got != target.SafeNopTotal {
		t.Errorf("bound for the recommended host timers %v, daemon warns above %v", got, target.SafeNopTotal)
	}
	if sum := target.DefaultNopInterval + target.DefaultNopTimeout; sum >= target.SafeNopTotal {
		t.Errorf("default nop_interval + nop_timeout %v, want below %v", sum, target.SafeNopTotal)
	}
	var b bytes.Buffer
	writeMultipathConf(&b, o)
	if !strings.Contains(b.String(), "nop_interval + nop_timeout") || !strings.Contains(b.String(), "= 2.5 s here") {
		t.Errorf("the target's bound is not printed:\n%s", b.String())
	}
}
