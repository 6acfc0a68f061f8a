package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/tests/interop/servers"
)

// qmp is a minimal QMP client: one command at a time, events skipped.
type qmp struct {
	t  *testing.T
	c  net.Conn
	rd *bufio.Reader
}

func dialQMP(t *testing.T, path string) *qmp {
	t.Helper()
	var c net.Conn
	var err error
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QMP socket: %v", err)
		}
	}
	q := &qmp{t: t, c: c, rd: bufio.NewReader(c)}
	c.SetDeadline(time.Now().Add(2 * time.Minute))
	q.rd.ReadString('\n') // greeting
	if _, errMsg := q.cmd("qmp_capabilities", nil); errMsg != "" {
		t.Fatal(errMsg)
	}
	return q
}

// cmd runs one command and returns its "return" value or its error text.
func (q *qmp) cmd(name string, args any) (json.RawMessage, string) {
	q.t.Helper()
	req := map[string]any{"execute": name}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.c.Write(append(b, '\n')); err != nil {
		q.t.Fatal(err)
	}
	for {
		line, err := q.rd.ReadString('\n')
		if err != nil {
			q.t.Fatalf("QMP %s: %v", name, err)
		}
		var r struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Desc string `json:"desc"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		if r.Error != nil {
			return nil, r.Error.Desc
		}
		if r.Return != nil {
			return r.Return, ""
		}
	}
}

// TestGrowUnderRunningQEMU checks the procedure docs/volumes.md gives for
// growing a disk under a running QEMU: `vmsan volume resize VOL +SIZE`,
// then, because NBD has no resize notification (QEMU's block_resize on an
// NBD node fails with "Cannot grow NBD nodes"), a second NBD node opened
// on the volume (its handshake sees the new size), blockdev-reopen of the
// disk's raw node onto it, and block_resize, after which the virtio disk
// has the new size. The machine stays paused (-S): no guest is needed to
// see the device's size.
func TestGrowUnderRunningQEMU(t *testing.T) {
	if serverKind != servers.VMSAN {
		t.Skip("resizes with vmsan volume resize") // skip: variant
	}
	need(t, "qemu-system-x86_64")
	tg := newTarget(t, 64*MiB)
	u, err := url.Parse(tg.uri())
	if err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "qmp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	qmpSock := filepath.Join(sockDir, "qmp.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nbdNode := func(name string) string {
		return "driver=nbd,node-name=" + name + ",server.type=inet,server.host=" + u.Hostname() + ",server.port=" + u.Port() + ",export=" + tg.name
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-M", "q35", "-accel", "tcg", "-nodefaults", "-display", "none", "-S",
		"-blockdev", nbdNode("nbd0"),
		"-blockdev", "driver=raw,node-name=drive0,file=nbd0",
		"-device", "virtio-blk-pci,drive=drive0,id=vd0",
		"-qmp", "unix:"+qmpSock+",server=on,wait=off")
	var qout strings.Builder
	cmd.Stdout, cmd.Stderr = &qout, &qout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	q := dialQMP(t, qmpSock)

	diskSize := func() int64 {
		t.Helper()
		ret, errMsg := q.cmd("query-block", nil)
		if errMsg != "" {
			t.Fatal(errMsg)
		}
		var bl []struct {
			QDev     string `json:"qdev"`
			Inserted struct {
				Image struct {
					VirtualSize int64 `json:"virtual-size"`
				} `json:"image"`
			} `json:"inserted"`
		}
		if err := json.Unmarshal(ret, &bl); err != nil {
			t.Fatal(err)
		}
		for _, b := range bl {
			if strings.Contains(b.QDev, "vd0") {
				return b.Inserted.Image.VirtualSize
			}
		}
		t.Fatalf("no vd0 in query-block: %s", ret)
		return 0
	}
	if got := diskSize(); got != 64*MiB {
		t.Fatalf("disk size at start %d", got)
	}
	mustRun(t, time.Minute, vmsanBin, "volume", "resize", tg.name, "+64M", "--data-dir", tg.dir)
	if _, errMsg := q.cmd("block_resize", map[string]any{"node-name": "drive0", "size": 128 * MiB}); errMsg == "" {
		t.Logf("this QEMU grew an NBD node in place (block_resize alone is enough here)")
	} else if !strings.Contains(errMsg, "Cannot grow NBD nodes") {
		t.Logf("block_resize on the old node: %s", errMsg)
	}
	steps := []struct {
		name string
		args any
	}{
		{"blockdev-add", map[string]any{"driver": "nbd", "node-name": "nbd1",
			"server": map[string]any{"type": "inet", "host": u.Hostname(), "port": u.Port()}, "export": tg.name}},
		{"blockdev-reopen", map[string]any{"options": []any{map[string]any{"driver": "raw", "node-name": "drive0", "file": "nbd1"}}}},
		{"block_resize", map[string]any{"node-name": "drive0", "size": 128 * MiB}},
		{"blockdev-del", map[string]any{"node-name": "nbd0"}},
	}
	for _, s := range steps {
		if _, errMsg := q.cmd(s.name, s.args); errMsg != "" {
			t.Fatalf("%s: %s\n%s", s.name, errMsg, qout.String())
		}
	}
	if got := diskSize(); got != 128*MiB {
		t.Fatalf("disk size after the procedure %d, want %d", got, 128*MiB)
	}
	q.cmd("quit", nil)
}
