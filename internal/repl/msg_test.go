package repl

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// Golden vectors pin the wire format: a change here breaks mixed-version
// pairs and must be deliberate.
func TestGoldenFrames(t *testing.T) {
	cases := []struct {
		m    Message
		want string
	}{
		{Message{Type: MsgPing}, "564d5250060000000000000000000000000000000000000000000000000000000000000000000000"},
		{Message{Type: MsgData, Op: OpWrite, Flags: FlagFUA, Seq: 7, Offset: 4096, Length: 2, Data: []byte{0xab, 0xcd}},
			"564d5250030101000000000000000007000000000000100000000000000000020000000200000000abcd"},
		{Message{Type: MsgWriteAck, Seq: 0x0102030405060708, Flags: FlagErr},
			"564d5250051000000102030405060708000000000000000000000000000000000000000000000000"},
	}
	for _, c := range cases {
		got := hex.EncodeToString(AppendEncode(nil, &c.m))
		if got != c.want {
			t.Errorf("%v: got %s want %s", c.m.Type, got, c.want)
		}
		b, _ := hex.DecodeString(c.want)
		m, n, err := Decode(b)
		if err != nil || n != len(b) || m.Type != c.m.Type || m.Seq != c.m.Seq || m.Offset != c.m.Offset || !bytes.Equal(m.Data, c.m.Data) {
			t.Errorf("decode %s: %+v %d %v", c.want, m, n, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	ok := AppendEncode(nil, &Message{Type: MsgData, Op: OpWrite, Length: 3, Data: []byte{1, 2, 3}})
	mut := func(f func(b []byte)) []byte { b := append([]byte(nil), ok...); f(b); return b }
	bad := map[string][]byte{
		"magic":       mut(func(b []byte) { b[0] = 0 }),
		"type":        mut(func(b []byte) { b[4] = 200 }),
		"op":          mut(func(b []byte) { b[6] = 9 }),
		"len≠data":    mut(func(b []byte) { b[31] = 4 }),
		"huge dlen":   mut(func(b []byte) { b[32] = 0xff }),
		"neg offset":  mut(func(b []byte) { b[16] = 0x80 }),
		"ping+data":   AppendEncode(nil, &Message{Type: MsgPing, Data: []byte{1}}),
		"short hash":  AppendEncode(nil, &Message{Type: MsgRSHash, Data: []byte{1}}),
		"short hello": AppendEncode(nil, &Message{Type: MsgHello, Data: []byte{1}}),
	}
	for name, b := range bad {
		if _, _, err := Decode(b); !errors.Is(err, ErrBadFrame) {
			t.Errorf("%s: err %v, want ErrBadFrame", name, err)
		}
	}
	if _, _, err := Decode(ok[:len(ok)-1]); err != ErrShort {
		t.Errorf("truncated: %v", err)
	}
}

func TestHelloRoundTrip(t *testing.T) {
	h := Hello{NodeID: 9, Gens: Generations{1, 2, [2]uint64{3, 4}}, Role: Primary, Disk: Outdated,
		Protocol: ProtoB, CrashedPrimary: true, PromotedAt: 12345, Size: 1 << 30, Dirty: 77}
	for _, discard := range []bool{false, true} {
		h.DiscardMyData = discard
		got, err := DecodeHello(EncodeHello(h))
		if err != nil || got != h {
			t.Fatalf("%+v %v", got, err)
		}
	}
	// Unknown flag bits are rejected (they may carry meaning later).
	b := EncodeHello(h)
	b[43] |= 4
	if _, err := DecodeHello(b); err == nil {
		t.Fatal("hello with an unknown flag accepted")
	}
}

func TestRunsRoundTrip(t *testing.T) {
	b := NewBitmap(100 * ChunkSize)
	for _, i := range []int64{0, 1, 2, 10, 50, 99} {
		b.SetChunk(i)
	}
	runs, err := DecodeRuns(EncodeRuns(b.Runs()), b.Chunks())
	if err != nil {
		t.Fatal(err)
	}
	c := NewBitmap(100 * ChunkSize)
	for _, r := range runs {
		for i := r.Start; i < r.End; i++ {
			c.SetChunk(i)
		}
	}
	if !slicesEqual(b.Words(), c.Words()) || c.Count() != 6 {
		t.Fatalf("runs round trip: %v", runs)
	}
	if _, err := DecodeRuns(EncodeRuns([]Run{{98, 101}}), 100); err == nil {
		t.Fatal("run beyond the volume accepted")
	}
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzDecode: Decode never panics, never over-reads, and what it accepts
// re-encodes to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(AppendEncode(nil, &Message{Type: MsgPing}))
	f.Add(AppendEncode(nil, &Message{Type: MsgData, Op: OpWrite, Length: 2, Data: []byte{1, 2}}))
	f.Add(AppendEncode(nil, &Message{Type: MsgHello, Data: EncodeHello(Hello{Size: 10})}))
	f.Add(AppendEncode(nil, &Message{Type: MsgBitmap, Data: EncodeRuns([]Run{{1, 3}})}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := Decode(b)
		if err != nil {
			return
		}
		if n > len(b) {
			t.Fatalf("consumed %d of %d", n, len(b))
		}
		again := AppendEncode(nil, &m)
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encode differs")
		}
		if m.Type == MsgHello {
			DecodeHello(m.Data)
		}
		if m.Type == MsgBitmap {
			DecodeRuns(m.Data, 1<<20)
		}
	})
}

// TestDecideSymmetric: for every pair of generation sets drawn from a small
// universe, both sides reach mirror decisions (never both sources or both
// targets), whatever the policy.
func TestDecideSymmetric(t *testing.T) {
	vals := []uint64{0, 1, 2, 3}
	var gens []Generations
	for _, c := range vals {
		for _, b := range vals {
			for _, h := range vals {
				gens = append(gens, Generations{Current: c, Bitmap: b, History: [2]uint64{h, 0}})
			}
		}
	}
	mirror := map[SyncKind]SyncKind{NoSync: NoSync, BitmapSource: BitmapTarget, BitmapTarget: BitmapSource,
		FullSource: FullTarget, FullTarget: FullSource, SplitBrain: SplitBrain, Unrelated: Unrelated, Refused: Refused}
	for pol := SBDisconnect; pol <= SBDiscardLeastChanges; pol++ {
		for _, g1 := range gens {
			for _, g2 := range gens {
				for _, dirty := range [][2]int64{{0, 0}, {0, 3}, {5, 1}} {
					// discard-my-data: neither, either, both.
					for dm := 0; dm < 4; dm++ {
						a := Hello{NodeID: 1, Gens: g1, Size: 10, Dirty: dirty[0], PromotedAt: 5, Disk: UpToDate, DiscardMyData: dm&1 != 0}
						b := Hello{NodeID: 2, Gens: g2, Size: 10, Dirty: dirty[1], PromotedAt: 9, Disk: UpToDate, DiscardMyData: dm&2 != 0}
						da, db := Decide(a, b, pol), Decide(b, a, pol)
						if mirror[da.Kind] != db.Kind {
							t.Fatalf("policy %v %v vs %v discard %d: %v / %v", pol, g1, g2, dm, da, db)
						}
						if dm == 1 && da.Resolved && da.Kind != BitmapTarget && da.Kind != FullTarget {
							t.Fatalf("discard-my-data on a, %v vs %v: a is %v", g1, g2, da)
						}
					}
				}
			}
		}
	}
}

// A peer cannot make us read (and allocate) an unbounded range: a hash
// request outside the volume or above MaxData is a protocol error.
func TestHashRequestBounded(t *testing.T) {
	n := NewNode(Config{NodeID: 1, Size: 1 << 20, Rand: func() uint64 { return 7 }}, Meta{Disk: UpToDate, Clean: true}, nil, nil)
	n.Listen()
	n.Connect()
	n.Ready()
	n.Step(Message{Type: MsgHello, Data: EncodeHello(Hello{NodeID: 2, Size: 1 << 20, Disk: UpToDate})})
	n.Step(Message{Type: MsgBitmap, Flags: FlagLast})
	if st := n.Status().Conn; st != Connected {
		t.Fatalf("conn %v", st)
	}
	n.Step(Message{Type: MsgVerifyReq, Offset: 0, Length: 1 << 40, Data: make([]byte, HashSize)})
	rd := n.Ready()
	if len(rd.Reads) != 0 || rd.Disconnect == "" {
		t.Fatalf("oversized verify request: reads %v, disconnect %q", rd.Reads, rd.Disconnect)
	}
}
