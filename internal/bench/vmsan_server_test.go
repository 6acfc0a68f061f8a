package bench

import (
	"context"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/export/exporttest"
	"github.com/vmsan/vmsan/internal/nbd/server"
	"github.com/vmsan/vmsan/internal/nbd/server/servertest"
)

// TestVmsanServerProfiles runs every profile against vmsan's own NBD server
// (the production engine over a sparse file) and checks the server's
// counters: bytes it received in WRITEs and sent in READs equal what the
// benchmark says it moved.
func TestVmsanServerProfiles(t *testing.T) {
	for _, prof := range Profiles {
		t.Run(prof, func(t *testing.T) {
			dev := exporttest.NewFileDevice(t, "default", 32<<20, backend.CacheWriteback)
			srv, sock := servertest.ServeUnix(t, server.Config{Registry: exporttest.NewRegistry(dev)})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			tg, err := OpenTarget(ctx, "nbd+unix:///default?socket="+sock, TargetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			res, err := RunProfile(ctx, tg, quickOpts(prof), nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := tg.Close(); err != nil {
				t.Fatal(err)
			}
			st := srv.Stats()
			tot := res.Totals
			t.Logf("%s: client read %d wrote %d; server sent %d received %d; connections %d", prof, tot.BytesRead, tot.BytesWritten, st.BytesRead, st.BytesWritten, res.Target.NBD.Connections)
			if uint64(tot.BytesWritten) != st.BytesWritten || uint64(tot.BytesRead) != st.BytesRead {
				t.Fatalf("client read %d wrote %d, server sent %d received %d", tot.BytesRead, tot.BytesWritten, st.BytesRead, st.BytesWritten)
			}
			if tot.BytesRead+tot.BytesWritten == 0 {
				t.Fatal("nothing moved")
			}
		})
	}
}
