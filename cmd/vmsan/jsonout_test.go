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
