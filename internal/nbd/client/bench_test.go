package client

import (
	"context"
	"testing"

	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/server"
	"github.com/vmsan/vmsan/internal/nbd/server/servertest"
)

// BenchmarkReadAt4K measures pipelined 4 KiB reads (b.RunParallel keeps
// GOMAXPROCS×parallelism requests in flight) against vmsan's server over a
// Unix socket with an in-memory volume: the client's and server's per-request
// cost, without a disk.
func BenchmarkReadAt4K(b *testing.B) {
	dev := exporttest.NewMemDevice(b, "m", 64<<20)
	_, sock := servertest.ServeUnix(b, server.Config{Registry: exporttest.NewRegistry(dev)})
	c, err := Dial(context.Background(), "nbd+unix:///m?socket="+sock, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetBytes(4096)
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 4096)
		off := int64(0)
		for pb.Next() {
			if _, err := c.ReadAt(buf, off); err != nil {
				b.Error(err)
				return
			}
			off = (off + 4096) % (64 << 20)
		}
	})
}
