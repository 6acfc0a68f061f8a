package client

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/proto"
	"github.com/vmsan/vmsan/internal/nbd/server"
	"github.com/vmsan/vmsan/internal/nbd/server/servertest"
)

// TestVmsanServer exercises the client against vmsan's own server over its
// production engine: pipelined writes from many goroutines, reads back,
// block status after a trim, and write-zeroes.
func TestVmsanServer(t *testing.T) {
	dev := exporttest.NewFileDevice(t, "vol", 16<<20, backend.CacheWriteback)
	_, sock := servertest.ServeUnix(t, server.Config{Registry: exporttest.NewRegistry(dev)})
	// An unknown export is refused during NBD_OPT_GO with the server's reason.
	if c, err := Dial(t.Context(), "nbd+unix:///nope?socket="+sock, nil); err == nil {
		c.Close()
		t.Fatal("Dial to an unknown export succeeded")
	} else if !strings.Contains(err.Error(), "NBD_REP_ERR_UNKNOWN") {
		t.Fatalf("unknown export: %v", err)
	}
	c := dial(t, "nbd+unix:///vol?socket="+sock, nil)
	ex := c.Export()
	if !ex.StructuredReplies || !ex.HasAlloc || c.Connections() != 4 || ex.Size != 16<<20 {
		t.Fatalf("negotiated %+v with %d connections", ex, c.Connections())
	}
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			b := bytes.Repeat([]byte{byte(g + 1)}, 64<<10)
			if _, err := c.WriteAt(b, int64(g)*64<<10); err != nil {
				t.Error(err)
			}
		}(g)
	}
	wg.Wait()
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 32*64<<10)
	if _, err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for g := 0; g < 32; g++ {
		if got[g*64<<10] != byte(g+1) || got[(g+1)*64<<10-1] != byte(g+1) {
			t.Fatalf("block %d reads back wrong", g)
		}
	}
	if err := c.Trim(0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := c.Zero(1<<20, 1<<20, proto.CmdFlagNoHole); err != nil {
		t.Fatal(err)
	}
	ext, err := c.BlockStatus(0, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	if len(ext) == 0 || ext[0].Offset != 0 || !ext[0].Zero {
		t.Fatalf("block status after trim: %+v", ext)
	}
	z := bytes.Repeat([]byte{9}, 2<<20)
	if _, err := c.ReadAt(z, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(z, make([]byte, 2<<20)) {
		t.Fatal("trimmed+zeroed range does not read as zeroes")
	}
}
