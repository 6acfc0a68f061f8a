package client

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/nbd/server"
	"github.com/vmsan/vmsan/internal/nbd/server/servertest"
	"github.com/vmsan/vmsan/internal/testutil"
)

func dialErr(t *testing.T, uri string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Dial(ctx, uri, &Options{Connections: 1})
	if err == nil {
		c.Close()
		t.Fatalf("Dial(%s) succeeded", uri)
	}
	var re *proto.RepError
	if !errors.As(err, &re) || re.Rep != proto.RepErrUnknown {
		t.Errorf("Dial(%s): %v does not carry the server's NBD_REP_ERR_UNKNOWN", uri, err)
	}
	return err
}

// TestURLWithoutExportName: a URL without an export name, to a server
// with no default export (qemu-nbd -x disk), fails naming the server's
// exports and the URL to write; so does a wrong name, against qemu-nbd
// and vmsan's own server.
func TestURLWithoutExportName(t *testing.T) {
	testutil.NeedTool(t, "qemu-nbd")
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "q.sock")
	startServer(t, sock, "qemu-nbd", "-f", "raw", "-k", sock, "-x", "disk", "-t", img)
	err := dialErr(t, "nbd+unix:///?socket="+sock)
	for _, want := range []string{
		"the URL names no export and " + sock + " has no default export",
		`its exports are "disk"`,
		"e.g. nbd+unix:///disk?socket=" + sock,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	err = dialErr(t, "nbd+unix:///dsik?socket="+sock)
	if !strings.Contains(err.Error(), sock+` has no export "dsik"; its exports are "disk"`) {
		t.Errorf("wrong name: %v", err)
	}
	// The right name still works on the same server.
	c := dial(t, "nbd+unix:///disk?socket="+sock, &Options{Connections: 1})
	c.Close()

	dev := exporttest.NewFileDevice(t, "vol", 1<<20, backend.CacheWriteback)
	_, vsock := servertest.ServeUnix(t, server.Config{Registry: exporttest.NewRegistry(dev)})
	err = dialErr(t, "nbd+unix:///nope?socket="+vsock)
	if !strings.Contains(err.Error(), vsock+` has no export "nope"; its exports are "vol"; name one in the URL, e.g. nbd+unix:///vol?socket=`+vsock) {
		t.Errorf("vmsan server, wrong name: %v", err)
	}
}

func TestExportURL(t *testing.T) {
	for _, c := range []struct {
		a    Address
		want string
	}{
		{Address{Network: "tcp", Addr: "10.0.0.1:10809"}, "nbd://10.0.0.1:10809/vm%201"},
		{Address{Network: "tcp", Addr: "[::1]:10809", TLS: true}, "nbds://[::1]:10809/vm%201"},
		{Address{Network: "unix", Addr: "/run/vmsan/nbd.sock"}, "nbd+unix:///vm%201?socket=/run/vmsan/nbd.sock"},
	} {
		if got := exportURL(c.a, "vm 1"); got != c.want {
			t.Errorf("exportURL(%+v) = %q, want %q", c.a, got, c.want)
		}
	}
}
