package scsi

import (
	"testing"

	"github.com/vmsan/vmsan/internal/vfs"
)

// TestPRAPTPLCrash: APTPL state goes through the filesystem seam, and
// what an initiator was told persists (or no longer persists) survives a
// crash right after the command completed.
func TestPRAPTPLCrash(t *testing.T) {
	f := newFixture(t)
	mem := vfs.NewMem()
	target := func(fsys vfs.FS) *Target {
		tg := New(Config{
			Registry: f.reg,
			LUNs:     func() []LUN { return []LUN{{Number: 0, Volume: "vol"}} },
			StateDir: func(string) (string, error) { return "/data/volumes/vol.state", nil },
			FS:       fsys,
		})
		t.Cleanup(tg.Close)
		return tg
	}
	f.tg.Close()
	f.tg = target(mem)
	a := nexus("iqn.a", 1)
	f.ready(a)
	f.prOK(a, prRegister, 0, 0, 0xA, 0x01) // APTPL set
	f.tg.Close()

	// Restart on the crash image: the registration is there.
	img := mem.CrashClone(nil)
	f.tg = target(img)
	a2 := nexus("iqn.a", 1)
	f.ready(a2)
	if _, keys := f.keys(a2); len(keys) != 1 || keys[0] != 0xA {
		t.Fatalf("keys after a crash %x, want [a]", keys)
	}
	// APTPL cleared, then a crash: the state file must stay gone.
	f.prOK(a2, prRegister, 0, 0xA, 0xA, 0)
	f.tg.Close()
	img2 := img.CrashClone(nil)
	f.tg = target(img2)
	a3 := nexus("iqn.a", 1)
	f.ready(a3)
	if _, keys := f.keys(a3); len(keys) != 0 {
		t.Fatalf("keys after APTPL was cleared and a crash: %x, want none", keys)
	}
}
