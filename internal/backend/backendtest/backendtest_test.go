package backendtest

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"github.com/vmsan/vmsan/internal/backend"
)

func TestCrashSimDurability(t *testing.T) {
	kept, lost := 0, 0
	for seed := uint64(0); seed < 64; seed++ {
		c := NewCrashSim(64, seed)
		c.WritevAt([][]byte{[]byte("AAAA")}, 0, false)
		c.Sync()
		c.WritevAt([][]byte{[]byte("BBBB")}, 8, false) // unsynced
		c.WritevAt([][]byte{[]byte("CC"), []byte("CC")}, 16, true)
		c.WritevAt([][]byte{[]byte("DDDD")}, 0, false) // unsynced overwrite of synced data
		img := c.Crash()
		if !bytes.Equal(img[16:20], []byte("CCCC")) {
			t.Fatalf("seed %d: FUA write lost: %q", seed, img[16:20])
		}
		if s := string(img[0:4]); s != "AAAA" && s != "DDDD" {
			t.Fatalf("seed %d: synced data corrupted: %q", seed, s)
		}
		switch string(img[8:12]) {
		case "BBBB":
			kept++
		case "\x00\x00\x00\x00":
			lost++
		default:
			t.Fatalf("torn write: %q", img[8:12])
		}
		// After the crash the simulator continues from the crashed image.
		got := make([]byte, 64)
		c.ReadvAt([][]byte{got}, 0)
		if !bytes.Equal(got, img) {
			t.Fatal("state after crash differs from returned image")
		}
	}
	if kept == 0 || lost == 0 {
		t.Fatalf("unsynced write kept %d / lost %d times out of 64: crash outcomes not random", kept, lost)
	}
}

func TestCrashSimZeroesOrdered(t *testing.T) {
	// A trim logged after a FUA write, then lost, must not take the FUA data
	// with it; a FUA write after an unsynced trim must survive it.
	for seed := uint64(0); seed < 32; seed++ {
		c := NewCrashSim(16, seed)
		c.Trim(0, 8)
		c.WritevAt([][]byte{[]byte("XY")}, 2, true)
		img := c.Crash()
		if string(img[2:4]) != "XY" {
			t.Fatalf("seed %d: %q", seed, img[2:4])
		}
	}
}

func TestFaultyAndCounting(t *testing.T) {
	m := backend.NewMem(1 << 16)
	f := NewFaulty(m, Rule{Op: OpWrite, Off: 4096, Len: 4096, Err: syscall.EIO, Skip: 1, Times: 1})
	c := NewCounting(f)
	buf := make([]byte, 4096)
	for i, want := range []error{nil, syscall.EIO, nil} {
		if err := c.WritevAt([][]byte{buf}, 4096, false); !errors.Is(err, want) && (err != nil || want != nil) {
			t.Fatalf("write %d: %v, want %v", i, err, want)
		}
	}
	if err := c.WritevAt([][]byte{buf[:100], buf[100:]}, 0, false); err != nil {
		t.Fatal("non-matching range failed:", err)
	}
	if f.Failed() != 1 {
		t.Fatalf("failed %d", f.Failed())
	}
	sizes := c.Sizes(OpWrite)
	if len(sizes) != 4 || sizes[3] != 4096 || c.Calls()[3].NBufs != 2 || c.MaxActive() != 1 {
		t.Fatalf("counting: %v %+v", sizes, c.Calls())
	}
}
