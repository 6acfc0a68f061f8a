package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/volume"
)

// TestDoctorJSON runs `vmsan doctor --data-dir DIR --json` through the
// command tree and checks the JSON shape: an array of objects with exactly
// check, subject, status, evidence and fix, statuses ok/warn/fail, and an
// error (exit status 1) exactly when a row failed.
func TestDoctorJSON(t *testing.T) {
	dir := t.TempDir()
	s, err := volume.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(volume.CreateOptions{Name: "vm1", Size: 1 << 30, Cache: "unsafe"}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	var out bytes.Buffer
	rootCmd := newRootCmd()
	rootCmd.SetOut(&out)
	rootCmd.SetArgs([]string{"doctor", "--data-dir", dir, "--json", "--no-history"})
	runErr := rootCmd.Execute()

	var rows []map[string]any
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("not a JSON array: %v\n%s", err, out.String())
	}
	if len(rows) == 0 {
		t.Fatal("no rows")
	}
	failed := false
	sawUnsafe := false
	for _, r := range rows {
		var keys []string
		for k, v := range r {
			keys = append(keys, k)
			if _, ok := v.(string); !ok {
				t.Errorf("row %v: %s is %T, want string", r, k, v)
			}
		}
		sort.Strings(keys)
		if strings.Join(keys, ",") != "check,evidence,fix,status,subject" {
			t.Errorf("row keys %v", keys)
		}
		switch r["status"] {
		case "ok", "warn":
		case "fail":
			failed = true
		default:
			t.Errorf("row %v: bad status", r)
		}
		if r["check"] == "volume.cache" && r["subject"] == "vm1" && r["status"] == "warn" {
			sawUnsafe = true
		}
	}
	if !sawUnsafe {
		t.Errorf("no volume.cache warn row for the cache=unsafe volume in %s", out.String())
	}
	var df errDoctorFailed
	if failed != errors.As(runErr, &df) {
		t.Errorf("a row failed: %v, command error: %v", failed, runErr)
	}
	if _, err := os.Stat(filepath.Join(dir, "doctor-history.json")); err == nil {
		t.Errorf("--no-history wrote a history file")
	}
}
