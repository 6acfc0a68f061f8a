package daemon

import (
	"bufio"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/iscsi/iscsifront"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// TestISCSIResizeAsyncMessage: an online resize reaches a logged-in iSCSI
// initiator as an Asynchronous Message (CAPACITY DATA HAS CHANGED).
func TestISCSIResizeAsyncMessage(t *testing.T) {
	r := start(t, t.TempDir(), func(c *config.Config) {
		c.ISCSI = config.ISCSI{Listen: []config.ISCSIPortal{{Addr: "127.0.0.1:0"}}, NodeName: "t", AllowAny: true}
	})
	var addr string
	for _, fe := range r.d.FrontEnds() {
		if f, ok := fe.(*iscsifront.FrontEnd); ok {
			addr = f.Addrs()[0].String()
		}
	}
	if addr == "" {
		t.Fatal("no iSCSI front end")
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := pdu.Reader{R: bufio.NewReader(c), MaxData: 1 << 20}
	send := func(h pdu.PDU, data []byte) {
		b, err := pdu.AppendPDU(nil, h, nil, data, pdu.Digests{})
		if err != nil {
			t.Fatal(err)
		}
		c.Write(b)
	}
	keys, _ := text.Append(nil, text.Pair{Key: "InitiatorName", Value: "iqn.2026-11.test:i"},
		text.Pair{Key: "TargetName", Value: "iqn.2026-11.org.vmsan:t"})
	send(&pdu.LoginRequest{Transit: true, CSG: 1, NSG: 3, ISID: pdu.ISID{0x80}, CmdSN: 1}, keys)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := rd.Read()
	if lr, ok := f.Header.(*pdu.LoginResponse); err != nil || !ok || lr.Status != 0 {
		t.Fatalf("login: %v %+v", err, f.Header)
	}
	if _, err := r.d.vo.ResizeVolume(config.DefaultVolumeName, 11<<30, false); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := rd.Read()
		if err != nil {
			t.Fatalf("no Asynchronous Message after the resize: %v", err)
		}
		if am, ok := f.Header.(*pdu.AsyncMessage); ok {
			sense, _ := pdu.ParseSenseData(f.Data)
			if am.AsyncEvent != pdu.AsyncSCSIEvent || len(sense) < 14 || sense[12] != 0x2a || sense[13] != 0x09 {
				t.Fatalf("async message %+v sense %x", am, sense)
			}
			return
		}
	}
}

// TestISCSIDeleteAfterLogout: a volume an iSCSI LUN has opened can be
// deleted without --force once no session uses it; while one does, the
// delete is refused.
func TestISCSIDeleteAfterLogout(t *testing.T) {
	ls := testutil.NeedTool(t, "iscsi-ls")
	r := start(t, t.TempDir(), func(c *config.Config) {
		c.ISCSI = config.ISCSI{Listen: []config.ISCSIPortal{{Addr: "127.0.0.1:0"}}, NodeName: "t", AllowAny: true}
	})
	if _, err := r.d.vo.CreateVolume(volume.CreateOptions{Name: "extra", Size: 8 << 20}); err != nil {
		t.Fatal(err)
	}
	var addr string
	for _, fe := range r.d.FrontEnds() {
		if f, ok := fe.(*iscsifront.FrontEnd); ok {
			addr = f.Addrs()[0].String()
		}
	}
	// iscsi-ls -s reads every LUN's capacity: the LUs open their volumes.
	if out, err := exec.Command(ls, "-s", "iscsi://"+addr).CombinedOutput(); err != nil || !strings.Contains(string(out), "Lun:1") {
		t.Fatalf("iscsi-ls: %v\n%s", err, out)
	}
	// A logged-in session holds the volume.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	keys, _ := text.Append(nil, text.Pair{Key: "InitiatorName", Value: "iqn.2026-11.test:i"},
		text.Pair{Key: "TargetName", Value: "iqn.2026-11.org.vmsan:t"})
	b, _ := pdu.AppendPDU(nil, &pdu.LoginRequest{Transit: true, CSG: 1, NSG: 3, ISID: pdu.ISID{0x80}, CmdSN: 1}, nil, keys, pdu.Digests{})
	c.Write(b)
	rd := pdu.Reader{R: bufio.NewReader(c)}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if f, err := rd.Read(); err != nil || f.Header.(*pdu.LoginResponse).Status != 0 {
		t.Fatalf("login: %v", err)
	}
	if err := r.d.vo.DeleteVolume("extra", false); err == nil {
		t.Fatal("deleted a volume an iSCSI session is logged in to")
	}
	c.Close()
	waitFor(t, "the session to end", func() bool { return r.d.status().FrontEnds != nil && len(r.d.clients()["extra"]) == 0 })
	if err := r.d.vo.DeleteVolume("extra", false); err != nil {
		t.Fatalf("delete after the iSCSI sessions ended: %v", err)
	}
}
