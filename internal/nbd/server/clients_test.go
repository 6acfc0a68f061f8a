package server

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/testutil"
)

const clientSize = 64 << 20

// realServer serves a writeback file device "disk" and a read-only
// rotational Mem device "ro" through a real ioengine.
func realServer(t *testing.T, cfg Config) (*Server, string, *exporttest.Device) {
	t.Helper()
	disk := exporttest.NewFileDevice(t, "disk", clientSize, backend.CacheWriteback)
	disk.Meta.Description = "vmsan test disk"
	ro := exporttest.NewMemDevice(t, "ro", 1<<20)
	ro.Meta.ReadOnly, ro.Meta.Rotational, ro.Meta.CanMultiConn = true, true, false
	cfg.Registry = exporttest.NewRegistry(disk, ro)
	srv, addr := startServer(t, cfg)
	return srv, addr, disk
}

func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("%s timed out", name)
	}
}

func TestNbdinfo(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	_, addr, _ := realServer(t, Config{})
	uri := "nbd://" + addr + "/disk"
	out, err := run(t, "nbdinfo", "--json", uri)
	if err != nil {
		t.Fatalf("nbdinfo --json: %v\n%s", err, out)
	}
	var js struct {
		Protocol   string `json:"protocol"`
		Structured bool   `json:"structured"`
		Exports    []map[string]any
	}
	if err := json.Unmarshal([]byte(out), &js); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if js.Protocol != "newstyle-fixed" || !js.Structured || len(js.Exports) != 1 {
		t.Fatalf("json %s", out)
	}
	e := js.Exports[0]
	want := map[string]any{
		"export-name": "disk", "description": "vmsan test disk", "export-size": float64(clientSize),
		"is_read_only": false, "is_rotational": false, "can_flush": true, "can_fua": true, "can_trim": true,
		"can_zero": true, "can_fast_zero": true, "can_cache": true, "can_df": true, "can_multi_conn": true,
		"block_size_minimum": float64(1), "block_size_preferred": float64(4096), "block_size_maximum": float64(32 << 20),
	}
	for k, v := range want {
		if e[k] != v {
			t.Errorf("%s = %v, want %v", k, e[k], v)
		}
	}
	// --can for every flag: true on "disk", and the write-side ones false on "ro".
	for _, f := range []string{"connect", "read", "write", "flush", "fua", "trim", "zero", "fast-zero", "cache", "df", "multi-conn", "structured-reply"} {
		if out, err := run(t, "nbdinfo", "--can", f, uri); err != nil {
			t.Errorf("--can %s on disk: %v %s", f, err, out)
		}
	}
	rouri := "nbd://" + addr + "/ro"
	for f, want := range map[string]bool{"write": false, "trim": false, "zero": false, "fast-zero": false, "multi-conn": false, "flush": true, "cache": true} {
		_, err := run(t, "nbdinfo", "--can", f, rouri)
		if (err == nil) != want {
			t.Errorf("--can %s on ro: err %v, want %v", f, err, want)
		}
	}
	for f, want := range map[string]bool{"read-only": true, "rotational": true} {
		if _, err := run(t, "nbdinfo", "--is", f, rouri); (err == nil) != want {
			t.Errorf("--is %s on ro: %v", f, err)
		}
	}
	out, err = run(t, "nbdinfo", "--list", "--json", "nbd://"+addr)
	if err != nil || !strings.Contains(out, `"disk"`) || !strings.Contains(out, `"ro"`) {
		t.Errorf("--list: %v %s", err, out)
	}
}

func TestQemuIOAndMap(t *testing.T) {
	testutil.NeedTool(t, "qemu-io")
	testutil.NeedTool(t, "nbdinfo")
	testutil.NeedTool(t, "qemu-img")
	_, addr, disk := realServer(t, Config{})
	uri := "nbd://" + addr + "/disk"
	cmds := []string{
		"write -P 0x5a 0 1M",
		"write -f -P 0xa5 4M 64k", // -f: FUA
		"aio_write -P 0x11 8M 4k", "aio_write -P 0x12 8196k 4k", "aio_write -P 0x13 8200k 4k", "aio_flush",
		"read -P 0x5a 0 1M",
		"read -P 0xa5 4M 64k",
		"read -P 0x12 8196k 4k",
		"write -z 512k 256k",
		"read -P 0 512k 256k",
		"read -P 0x5a 768k 256k",
		"discard 0 256k",
		"read -P 0 0 256k",
		"flush",
	}
	args := []string{"-f", "raw"}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	out, err := run(t, "qemu-io", append(args, uri)...)
	if err != nil || strings.Contains(out, "Pattern verification failed") || strings.Contains(out, "failed") {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	// The discard punched a hole: nbdinfo --map and qemu-img map agree.
	out, err = run(t, "nbdinfo", "--map", "--json", uri)
	if err != nil {
		t.Fatalf("--map: %v %s", err, out)
	}
	var ext []struct {
		Offset int64 `json:"offset"`
		Length int64 `json:"length"`
		Type   int   `json:"type"`
	}
	if err := json.Unmarshal([]byte(out), &ext); err != nil {
		t.Fatal(err, out)
	}
	if len(ext) < 3 || ext[0].Offset != 0 || ext[0].Length != 256<<10 || ext[0].Type != 3 || ext[1].Type != 0 {
		t.Errorf("map %+v", ext)
	}
	out, err = run(t, "qemu-img", "map", "--output=json", "--image-opts", "driver=nbd,server.type=inet,server.host="+strings.Split(addr, ":")[0]+",server.port="+strings.Split(addr, ":")[1]+",export=disk")
	if err != nil || !strings.Contains(out, `"start": 0, "length": 262144, "depth": 0, "present": true, "zero": true, "data": false`) {
		t.Errorf("qemu-img map: %v\n%s", err, out[:min(len(out), 600)])
	}
	// What the client wrote reached the file.
	buf := make([]byte, 4096)
	if err := disk.Backend.ReadvAt([][]byte{buf}, 8196<<10); err != nil || !bytes.Equal(buf, bytes.Repeat([]byte{0x12}, 4096)) {
		t.Errorf("backend content %x %v", buf[:8], err)
	}
}

func TestUnixSocket(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	disk := exporttest.NewMemDevice(t, "disk", 1<<20)
	srv := New(Config{Registry: exporttest.NewRegistry(disk)})
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Shutdown(t.Context())
	out, err := run(t, "nbdinfo", "--size", "nbd+unix:///disk?socket="+sock)
	if err != nil || strings.TrimSpace(out) != "1048576" {
		t.Fatalf("%v %q", err, out)
	}
}

func TestTLS(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	testutil.NeedTool(t, "qemu-img")
	dir := t.TempDir()
	certs := testutil.WriteTLSCerts(t, dir)
	pool, cert := certs.CAPool, certs.Server
	tcfg := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	for _, mode := range []TLSMode{TLSRequired, TLSOptional, TLSOff} {
		t.Run(mode.String(), func(t *testing.T) {
			srv, addr, _ := realServer(t, Config{TLSConfig: tcfg, TLSMode: mode})
			host, port, _ := net.SplitHostPort(addr)
			// libnbd: nbds:// requires TLS; nbd:// never uses it.
			_, tlsErr := run(t, "nbdinfo", "--size", "nbds://localhost:"+port+"/disk?tls-certificates="+dir)
			out, plainErr := run(t, "nbdinfo", "--size", "nbd://"+addr+"/disk")
			wantTLS, wantPlain := mode != TLSOff, mode != TLSRequired
			if (tlsErr == nil) != wantTLS {
				t.Errorf("nbdinfo over TLS: err %v, want success %v", tlsErr, wantTLS)
			}
			if (plainErr == nil) != wantPlain {
				t.Errorf("nbdinfo plain: err %v (%s), want success %v", plainErr, out, wantPlain)
			}
			// qemu-img with x509 creds.
			out, qerr := run(t, "qemu-img", "info", "--output=json",
				"--object", "tls-creds-x509,id=tls0,dir="+dir+",endpoint=client",
				"--image-opts", "driver=nbd,server.type=inet,server.host=localhost,server.port="+port+",export=disk,tls-creds=tls0")
			if (qerr == nil) != wantTLS {
				t.Errorf("qemu-img over TLS: err %v, want success %v\n%s", qerr, wantTLS, out)
			}
			if qerr == nil && !strings.Contains(out, fmt.Sprint(clientSize)) {
				t.Errorf("qemu-img info: %s", out)
			}
			if got := srv.Stats().TLSHandshakes; (got > 0) != wantTLS {
				t.Errorf("TLS handshakes %d", got)
			}
			_ = host
		})
	}
}

var _ export.Registry = (*exporttest.Registry)(nil)

// TestSTARTTLSResetsState drives STARTTLS by hand with crypto/tls: state
// negotiated in clear text (structured replies) is dropped by the upgrade,
// and in required mode nothing but STARTTLS/ABORT is served before it.
func TestSTARTTLSResetsState(t *testing.T) {
	dir := t.TempDir()
	certs := testutil.WriteTLSCerts(t, dir)
	pool, cert := certs.CAPool, certs.Server
	ccert, err := tls.LoadX509KeyPair(filepath.Join(dir, "client-cert.pem"), filepath.Join(dir, "client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	scfg := &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	ccfg := &tls.Config{Certificates: []tls.Certificate{ccert}, RootCAs: pool, ServerName: "localhost"}

	_, addr, _ := realServer(t, Config{TLSConfig: scfg, TLSMode: TLSOptional})
	rc := dialRaw(t, addr)
	rc.flags(proto.FlagCFixedNewstyle | proto.FlagCNoZeroes)
	if rs := rc.option(proto.OptStructuredReply, nil); rs[0].h.Type != proto.RepAck {
		t.Fatal("structured")
	}
	if rs := rc.option(proto.OptStartTLS, []byte{1}); rs[0].h.Type != proto.RepErrInvalid {
		t.Fatalf("STARTTLS with data: %v", rs[0].h.Type)
	}
	if rs := rc.option(proto.OptStartTLS, nil); rs[0].h.Type != proto.RepAck {
		t.Fatalf("STARTTLS: %v", rs[0].h.Type)
	}
	tc := tls.Client(rc.c, ccfg)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	rc.c = tc
	if rs := rc.option(proto.OptStartTLS, nil); rs[0].h.Type != proto.RepErrInvalid {
		t.Fatalf("second STARTTLS: %v", rs[0].h.Type)
	}
	rs := rc.option(proto.OptGo, proto.AppendInfoRequest(nil, "disk", nil))
	in, _ := proto.ParseInfo(rs[0].data)
	if in.Export.Flags&proto.FlagSendDF != 0 {
		t.Errorf("structured replies survived STARTTLS: flags %#x", in.Export.Flags)
	}
	// Simple replies now: a READ answers with the simple magic.
	if r := rc.do(proto.Request{Type: proto.CmdRead, Cookie: 1, Length: 4096}, nil); r.errno != 0 || len(r.chunks) != 0 || len(r.data) != 4096 {
		t.Errorf("read over TLS %+v", r)
	}

	// Required mode: everything but STARTTLS/ABORT gets TLS_REQD; EXPORT_NAME closes.
	_, addr, _ = realServer(t, Config{TLSConfig: scfg, TLSMode: TLSRequired})
	rc = dialRaw(t, addr)
	rc.flags(proto.FlagCFixedNewstyle | proto.FlagCNoZeroes)
	for _, o := range []proto.Opt{proto.OptList, proto.OptStructuredReply, proto.OptGo, proto.OptInfo, 999} {
		if rs := rc.option(o, nil); rs[0].h.Type != proto.RepErrTLSReqd {
			t.Errorf("%v before TLS: %v", o, rs[0].h.Type)
		}
	}
	rc.send(proto.AppendOption(nil, proto.OptExportName, []byte("disk")))
	rc.expectClosed()
}

// TestNbdcopyMultiConn copies random data in and out over 4 connections
// (CAN_MULTI_CONN) and compares. nbdcopy caps connections at --threads,
// which defaults to the number of CPUs, hence --threads=4.
func TestNbdcopyMultiConn(t *testing.T) {
	testutil.NeedTool(t, "nbdcopy")
	srv, addr, _ := realServer(t, Config{})
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	data := make([]byte, 16<<20)
	rand.Read(data[:8<<20]) // second half stays zero: exercises holes/zeroes
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	uri := "nbd://" + addr + "/disk"
	if out, err := run(t, "nbdcopy", "--connections=4", "--threads=4", "--requests=16", src, uri); err != nil {
		t.Fatalf("nbdcopy in: %v %s", err, out)
	}
	in := srv.Stats().Accepted
	if out, err := run(t, "nbdcopy", "--connections=4", "--threads=4", uri, dst); err != nil {
		t.Fatalf("nbdcopy out: %v %s", err, out)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != clientSize || !bytes.Equal(got[:len(data)], data) || !bytes.Equal(got[len(data):], make([]byte, clientSize-len(data))) {
		t.Fatal("copied data differs")
	}
	t.Logf("connections: copy in %d, copy out %d", in, srv.Stats().Accepted-in)
	if in < 4 {
		t.Errorf("nbdcopy did not use multi-conn: %d connections", in)
	}
}
