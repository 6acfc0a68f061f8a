package iscsi

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBenchNoSuchLUN: `vmsan bench` against a LUN number the target does
// not have says so in words, with the LUNs it has, instead of the raw
// sense 05/25/00; the command fails.
func TestBenchNoSuchLUN(t *testing.T) {
	t.Parallel()
	v := startVmsan(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, vmsanBin, "bench", "-p", "job", "--runtime", "1s", "--read-only", "-o", "none", "-q", v.url("", 7)).CombinedOutput()
	if err == nil {
		t.Fatalf("bench against LUN 7 succeeded:\n%s", out)
	}
	if !strings.Contains(string(out), "no LUN 7 on this target") || !strings.Contains(string(out), "it has LUN 0") {
		t.Fatalf("bench against LUN 7: %v\n%s", err, out)
	}
}
