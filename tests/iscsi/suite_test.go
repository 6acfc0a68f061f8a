package iscsi

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// expectedFailures are the iscsi-test-cu tests vmsan may fail (or not
// pass where tgt passes), each with its reason; docs/iscsi.md has the
// same list. A test listed here that vmsan passes is reported, so the
// list shrinks as the gaps close.
var expectedFailures = map[string]string{
	// libiscsi sends its Data-Out PDUs with a corrupted DataSN and, after
	// the first failure, reconnects; the third case (DataSN 0xffffffff on
	// a one-block write) is then sent as immediate data on the new session
	// (the test's ImmediateData=No override does not survive libiscsi's
	// reconnect), so no Data-Out carries the bad DataSN and the write
	// succeeds. tgt fails all four cases.
	"iSCSIdatasn.iSCSIDataSnInvalid": "test's ImmediateData override is lost on libiscsi's reconnect",
	// The test's second loop asks GET LBA STATUS for LBA i+1 and then
	// requires the first descriptor to start at i+LBPPB (logical blocks
	// per physical block). SBC-3 says the first descriptor starts at the
	// requested LBA, so the check only holds when LBPPB is 1; vmsan's
	// volumes report 4096-byte physical blocks (LBPPB 8). tgt skips the
	// test (no thin provisioning).
	"GetLBAStatus.UnmapSingle": "test expects LBA i+LBPPB for a request at i+1; holds only with LBPPB 1",
}

type cuResult string

const (
	cuPass cuResult = "pass"
	cuFail cuResult = "fail"
	cuSkip cuResult = "skip"
)

var (
	reSuite = regexp.MustCompile(`^Suite: (\S+)`)
	reTest  = regexp.MustCompile(`^  Test: (\S+) \.\.\.(.*)$`)
)

// parseCU reads iscsi-test-cu's verbose output: "Suite: S", then per test
// "  Test: T ..." followed (on that line or later ones) by "passed" or
// "FAILED"; a test that printed "[SKIPPED]" and passed is a skip.
func parseCU(out string) map[string]cuResult {
	res := map[string]cuResult{}
	suite, cur, skipped := "", "", false
	finish := func(r cuResult) {
		if cur == "" {
			return
		}
		if r == cuPass && skipped {
			r = cuSkip
		}
		res[cur] = r
		cur = ""
	}
	check := func(s string) {
		if strings.Contains(s, "[SKIPPED]") {
			skipped = true
		}
		tr := strings.TrimSpace(s)
		switch {
		case tr == "passed" || strings.HasSuffix(tr, "...passed") || strings.HasSuffix(s, "passed") && !strings.Contains(s, "[") && strings.TrimSpace(strings.TrimSuffix(tr, "passed")) == "":
			finish(cuPass)
		case tr == "FAILED":
			finish(cuFail)
		case strings.HasPrefix(tr, "passed "):
			// CUnit's verdict, then log lines of the suite's teardown on
			// the same line (e.g. its cleanup meeting a unit attention).
			finish(cuPass)
		}
	}
	for _, l := range lines(out) {
		if m := reSuite.FindStringSubmatch(l); m != nil {
			suite = m[1]
			continue
		}
		if m := reTest.FindStringSubmatch(l); m != nil {
			if cur != "" {
				finish(cuFail) // no verdict: treat as failed
			}
			cur, skipped = suite+"."+m[1], false
			check(m[2])
			continue
		}
		if cur != "" {
			check(l)
		}
	}
	if cur != "" {
		finish(cuFail)
	}
	return res
}

// suites lists iscsi-test-cu's suites (ALL.<suite>).
func suites(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.Command(bin, "--list").CombinedOutput()
	if err != nil {
		t.Fatalf("iscsi-test-cu --list: %v\n%s", err, out)
	}
	re := regexp.MustCompile(`^ALL\.([A-Za-z0-9_]+)$`)
	var names []string
	for _, l := range lines(string(out)) {
		if m := re.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			names = append(names, m[1])
		}
	}
	if len(names) < 20 {
		t.Fatalf("iscsi-test-cu --list: only %d suites:\n%s", len(names), out)
	}
	return names
}

// runSuite runs the whole suite, one iscsi-test-cu process per test suite:
// a crash of the tool in one suite (its reconnect logic after the
// deliberate protocol errors of iSCSIdatasn has been seen to die mid-run
// in the ALL run) then costs that suite's results (counted as failures),
// not the rest of the run.
func runSuite(t *testing.T, url, logName string) map[string]cuResult {
	t.Helper()
	bin := testutil.NeedTool(t, "iscsi-test-cu")
	var all strings.Builder
	for _, su := range suites(t, bin) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, bin, "--dataloss", "--verbose", "--test=ALL."+su, url)
		cmd.Dir = t.TempDir()          // it may write CUnit files into the cwd
		out, _ := cmd.CombinedOutput() // exits non-zero when any test fails
		if ctx.Err() != nil {
			t.Errorf("iscsi-test-cu suite %s against %s timed out", su, logName)
		}
		cancel()
		if !strings.Contains(string(out), "Suite: "+su) {
			// Nothing ran (a login failure): keep the output for the log
			// and let the missing results count.
			fmt.Fprintf(&all, "Suite: %s\n", su)
		}
		all.Write(out)
		all.WriteString("\n")
	}
	if d := os.Getenv("VMSAN_ISCSI_SUITE_LOGS"); d != "" {
		_ = os.WriteFile(filepath.Join(d, logName+".txt"), []byte(all.String()), 0o644)
	}
	res := parseCU(all.String())
	if len(res) < 100 {
		t.Fatalf("iscsi-test-cu against %s: only %d test results parsed:\n%s", logName, len(res), tail(all.String()))
	}
	return res
}

func tail(s string) string {
	if len(s) > 6000 {
		return s[len(s)-6000:]
	}
	return s
}

// startTgt runs tgtd on a free port exporting file as LUN 1 of iqn.
func startTgt(t *testing.T, file, iqn string) string {
	t.Helper()
	testutil.NeedRoot(t, "tgtd (its control socket under /var/run) and tgtadm")
	tgtd := testutil.NeedTool(t, "tgtd")
	tgtadm := testutil.NeedTool(t, "tgtadm")
	port, err := servers.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// The control port names tgtd's management socket; derive it from
	// the (free) iSCSI port so parallel runs do not share one.
	ctl := fmt.Sprint(1000 + port%20000) // tgtadm accepts small numbers only
	logf, err := os.Create(filepath.Join(t.TempDir(), "tgtd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tgtd, "-f", "-C", ctl, "--iscsi", "portal="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		logf.Close()
	})
	adm := func(args ...string) error {
		var err error
		var out []byte
		for i := 0; i < 50; i++ { // tgtd needs a moment to open its socket
			out, err = exec.Command(tgtadm, append([]string{"-C", ctl, "--lld", "iscsi"}, args...)...).CombinedOutput()
			if err == nil {
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return fmt.Errorf("tgtadm %v: %v\n%s", args, err, out)
	}
	for _, a := range [][]string{
		{"--op", "new", "--mode", "target", "--tid", "1", "-T", iqn},
		{"--op", "new", "--mode", "logicalunit", "--tid", "1", "--lun", "1", "-b", file},
		{"--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL"},
	} {
		if err := adm(a...); err != nil {
			t.Fatal(err)
		}
	}
	return addr
}

// TestLibiscsiSuiteVsTgt runs libiscsi's conformance suite (family ALL,
// destructive tests included) against vmsan and then against tgtd
// exporting the same file, prints both results per test, and requires
// vmsan to pass every test tgt passes and to fail none, except
// expectedFailures.
func TestLibiscsiSuiteVsTgt(t *testing.T) {
	testutil.NeedTool(t, "iscsi-test-cu")
	testutil.NeedTool(t, "tgtd")
	v := startVmsan(t, "")
	vm := runSuite(t, v.url("", 0), "vmsan")
	v.stop(t) // the raw file is tgt's now
	tgtIQN := "iqn.2026-11.org.vmsan:tgt"
	addr := startTgt(t, v.raw, tgtIQN)
	tg := runSuite(t, fmt.Sprintf("iscsi://%s/%s/1", addr, tgtIQN), "tgt")

	names := make([]string, 0, len(vm)+len(tg))
	seen := map[string]bool{}
	for _, m := range []map[string]cuResult{vm, tg} {
		for n := range m {
			if !seen[n] {
				seen[n] = true
				names = append(names, n)
			}
		}
	}
	sort.Strings(names)
	count := func(m map[string]cuResult) map[cuResult]int {
		c := map[cuResult]int{}
		for _, r := range m {
			c[r]++
		}
		return c
	}
	var table strings.Builder
	fmt.Fprintf(&table, "%-55s %-6s %-6s\n", "test", "vmsan", "tgt")
	var bad []string
	for _, n := range names {
		a, b := vm[n], tg[n]
		if a == "" {
			a = cuFail // vmsan's run lost it (tool crash or hang)
		}
		if a != b {
			fmt.Fprintf(&table, "%-55s %-6s %-6s\n", n, a, b)
		}
		_, expected := expectedFailures[n]
		if (a == cuFail || b == cuPass && a != cuPass) && !expected {
			bad = append(bad, fmt.Sprintf("%s: vmsan %s, tgt %s", n, a, b))
		}
		if expected && a == cuPass {
			t.Logf("%s is in expectedFailures but passes now: remove it (and from docs/iscsi.md)", n)
		}
	}
	cv, ct := count(vm), count(tg)
	t.Logf("iscsi-test-cu ALL: vmsan pass %d fail %d skip %d; tgt pass %d fail %d skip %d\ndifferences:\n%s",
		cv[cuPass], cv[cuFail], cv[cuSkip], ct[cuPass], ct[cuFail], ct[cuSkip], table.String())
	if len(bad) > 0 {
		t.Errorf("vmsan fails (or does not pass where tgt passes) outside the expected list:\n  %s", strings.Join(bad, "\n  "))
	}
}

func TestParseCU(t *testing.T) {
	out := `Suite: A
  Test: One ...passed
  Test: Two ...    [SKIPPED] not implemented.
    [SKIPPED] not implemented.
passed
  Test: Three ...    [FAILED] bad
FAILED
    1. x.c:38  - CU_ASSERT_EQUAL(_r,0)
Suite: B
  Test: One ...passed
  Test: Two ...    [FAILED] RESERVE6 command: failed with sense. SENSE KEY:UNIT_ATTENTION(6)
passed    [FAILED] PRIN command: failed with sense. SENSE KEY:UNIT_ATTENTION(6)
`
	got := parseCU(out)
	want := map[string]cuResult{"A.One": cuPass, "A.Two": cuSkip, "A.Three": cuFail, "B.One": cuPass, "B.Two": cuPass}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q want %q (all %v)", k, got[k], v, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("parsed %v", got)
	}
}
