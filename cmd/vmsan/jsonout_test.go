package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/nbd/client"
)

var snakeKey = regexp.MustCompile(`^[a-z0-9]+(_[a-z0-9]+)*$`)

// badKeys returns the object keys in v (decoded JSON) that are not
// snake_case, with their paths.
func badKeys(path string, v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if !snakeKey.MatchString(k) {
				out = append(out, path+"."+k)
			}
			out = append(out, badKeys(path+"."+k, e)...)
		}
	case []any:
		for i, e := range x {
			out = append(out, badKeys(fmt.Sprintf("%s[%d]", path, i), e)...)
		}
	}
	return out
}

// TestStatusJSONSnakeCase: every key of `vmsan status --json` (NBD and
// iSCSI front ends on, a client connected, engine counters) is
// snake_case, and the NBD request counters are labelled by command.
func TestStatusJSONSnakeCase(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	vmsan(t, "volume", "create", "--data-dir", data, "v", "--size", "8M")
	sock := filepath.Join(data, "nbd.sock")
	d := &daemonProc{log: &syncBuf{}, exited: make(chan struct{})}
	d.cmd = exec.Command(binary(t), "serve", "--data-dir", data, "--listen", "unix:"+sock, "--iscsi-listen", "127.0.0.1:0")
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	defer d.stop(t)
	var c *client.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err = client.Dial(ctx, "nbd+unix:///v?socket="+sock, &client.Options{Connections: 1})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no NBD connection: %v\n%s", err, d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	if _, err := c.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	out := vmsan(t, "status", "--json", "--data-dir", data)
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if bad := badKeys("", st); len(bad) > 0 {
		t.Errorf("keys not in snake_case: %s", strings.Join(bad, ", "))
	}
	var typed struct {
		FrontEnds []struct {
			Name   string `json:"name"`
			Detail struct {
				Requests map[string]uint64 `json:"requests"`
			} `json:"detail"`
		} `json:"front_ends"`
	}
	json.Unmarshal([]byte(out), &typed)
	for _, fe := range typed.FrontEnds {
		if fe.Name == "nbd" && fe.Detail.Requests["write"] == 0 {
			t.Errorf("nbd detail requests %v: want writes counted by name", fe.Detail.Requests)
		}
	}
	if len(typed.FrontEnds) < 2 {
		t.Errorf("front ends %v: want nbd and iscsi", typed.FrontEnds)
	}
}

// run3 runs the real binary and returns stdout, stderr and the exit status.
func run3(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	c := exec.Command(binary(t), args...)
	var so, se strings.Builder
	c.Stdout, c.Stderr = &so, &se
	err := c.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return so.String(), se.String(), code
}

// jsonError decodes the error object a --json command prints on stderr.
func jsonError(t *testing.T, what, stdout, stderr string, code int) map[string]string {
	t.Helper()
	var e map[string]string
	if code == 0 || stdout != "" || json.Unmarshal([]byte(stderr), &e) != nil || e["error"] == "" {
		t.Errorf("%s: exit %d, stdout %q, stderr %q: want exit status non-zero, nothing on stdout and {\"error\": ...} on stderr", what, code, stdout, stderr)
	}
	return e
}

// TestJSONErrorsEverywhere: every command that takes --json (found by
// walking the command tree) reports a failure as one JSON object on
// stderr, with the exit status it has without --json.
func TestJSONErrorsEverywhere(t *testing.T) {
	rootCmd := newRootCmd()
	var cmds [][]string
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Runnable() && c.Flag("json") != nil {
			cmds = append(cmds, strings.Fields(c.CommandPath())[1:])
		}
		for _, sc := range c.Commands() {
			walk(sc)
		}
	}
	walk(rootCmd)
	if len(cmds) < 15 {
		t.Fatalf("only %d commands with --json: %v", len(cmds), cmds)
	}
	dir := filepath.Join(t.TempDir(), "none")
	for _, path := range cmds {
		// Six operands is too many for every command (or names files
		// that do not exist): each fails before doing anything.
		args := append(append([]string{}, path...), "a1", "a2", "a3", "a4", "a5", "a6")
		if c, _, err := rootCmd.Find(path); err == nil && c.Flag("data-dir") != nil {
			args = append(args, "--data-dir", dir)
		}
		_, _, plain := run3(t, args...)
		so, se, code := run3(t, append(args, "--json")...)
		jsonError(t, "vmsan "+strings.Join(args, " ")+" --json", so, se, code)
		if code != plain {
			t.Errorf("vmsan %s: exit %d with --json, %d without", strings.Join(args, " "), code, plain)
		}
	}
}

// TestJSONVolumeCommands: the volume commands print JSON objects with
// --json (delete and export included); snapshots are first-class names
// (volume info VOL@SNAP); a duplicate snapshot says which exists.
func TestJSONVolumeCommands(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	obj := func(args ...string) map[string]any {
		t.Helper()
		so, se, code := run3(t, append(args, "--data-dir", data, "--json")...)
		var m map[string]any
		if code != 0 || json.Unmarshal([]byte(so), &m) != nil {
			t.Fatalf("vmsan %s --json: exit %d\n%s\n%s", strings.Join(args, " "), code, so, se)
		}
		return m
	}
	if m := obj("volume", "create", "v", "--size", "1M"); m["name"] != "v" {
		t.Errorf("create: %v", m)
	}
	if m := obj("volume", "snapshot", "--copy", "v", "s1"); m["name"] != "v@s1" {
		t.Errorf("snapshot: %v", m)
	}
	so, se, code := run3(t, "volume", "snapshot", "--copy", "v", "s1", "--data-dir", data, "--json")
	if e := jsonError(t, "duplicate snapshot", so, se, code); e["error"] != "snapshot v@s1 already exists" || e["code"] != "exists" {
		t.Errorf("duplicate snapshot: %v", e)
	}
	if _, se, _ := run3(t, "volume", "snapshot", "--copy", "v", "s1", "--data-dir", data); !strings.Contains(se, "snapshot v@s1 already exists") {
		t.Errorf("duplicate snapshot without --json: %s", se)
	}
	if m := obj("volume", "info", "v@s1"); m["volume"] != "v" || m["snapshot"] != "s1" || m["size"] != float64(1<<20) {
		t.Errorf("info v@s1: %v", m)
	}
	if out := vmsan(t, "volume", "info", "v@s1", "--data-dir", data); !strings.Contains(out, "v@s1") || !strings.Contains(out, "snapshot of:") {
		t.Errorf("info v@s1:\n%s", out)
	}
	so, se, code = run3(t, "volume", "info", "v@nope", "--data-dir", data, "--json")
	if e := jsonError(t, "info v@nope", so, se, code); e["code"] != "not_found" || e["error"] != "no snapshot v@nope" {
		t.Errorf("info v@nope: %v", e)
	}
	if m := obj("volume", "export", "v@s1", filepath.Join(t.TempDir(), "s1.raw")); m["format"] != "raw" || m["mode"] != "0600" {
		t.Errorf("export: %v", m)
	}
	if m := obj("volume", "delete", "v@s1"); m["deleted"] != "v@s1" || m["kind"] != "snapshot" {
		t.Errorf("delete v@s1: %v", m)
	}
	if m := obj("volume", "delete", "v"); m["deleted"] != "v" || m["kind"] != "volume" {
		t.Errorf("delete v: %v", m)
	}
	so, se, code = run3(t, "volume", "info", "v", "--data-dir", data, "--json")
	if e := jsonError(t, "info v after delete", so, se, code); e["code"] != "not_found" {
		t.Errorf("info after delete: %v", e)
	}
}
