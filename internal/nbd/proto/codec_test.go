package proto

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []Request{
		{},
		{Flags: CmdFlagFUA, Type: CmdWrite, Cookie: 0xdeadbeefcafef00d, Offset: 1 << 40, Length: 1 << 25},
		{Flags: CmdFlagReqOne, Type: CmdBlockStatus, Cookie: 1, Offset: ^uint64(0), Length: ^uint32(0)},
	} {
		b := AppendRequest(nil, r)
		if len(b) != RequestSize {
			t.Fatalf("len %d", len(b))
		}
		got, err := ParseRequest(b)
		if err != nil || got != r {
			t.Errorf("round trip %+v -> %+v, %v", r, got, err)
		}
	}
	// Hand-assembled vector from the spec's request layout.
	want := []byte{0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x02, 0}
	if b := AppendRequest(nil, Request{Flags: CmdFlagFUA, Type: CmdWrite, Cookie: 7, Offset: 4096, Length: 512}); !bytes.Equal(b, want) {
		t.Errorf("encode %x want %x", b, want)
	}
}

func TestParseErrors(t *testing.T) {
	req := AppendRequest(nil, Request{Type: CmdRead, Length: 512})
	bad := append([]byte{}, req...)
	bad[0] = 0x12 // historic magic 0x12560953
	ext := append([]byte{}, req...)
	copy(ext, []byte{0x21, 0xe4, 0x1c, 0x71})
	cases := []struct {
		name string
		err  error
		fn   func() error
	}{
		{"short request", ErrShort, func() error { _, err := ParseRequest(req[:27]); return err }},
		{"bad request magic", ErrBadMagic, func() error { _, err := ParseRequest(bad); return err }},
		{"extended request magic", ErrBadMagic, func() error { _, err := ParseRequest(ext); return err }},
		{"option magic", ErrBadMagic, func() error { _, err := ParseOptionHeader(make([]byte, 16)); return err }},
		{"option too long", ErrTooLong, func() error {
			b := AppendOption(nil, OptGo, nil)
			b[12] = 0xff
			_, err := ParseOptionHeader(b)
			return err
		}},
		{"option data short", ErrShort, func() error {
			b := AppendOption(nil, OptGo, make([]byte, 10))
			_, err := ParseOption(b[:20])
			return err
		}},
		{"info name longer than data", ErrShort, func() error {
			_, err := ParseOption(AppendOption(nil, OptGo, []byte{0, 0, 0, 9, 'a'}))
			return err
		}},
		{"info name too long", ErrTooLong, func() error {
			_, err := ParseOption(AppendOption(nil, OptGo, []byte{0, 0, 0x10, 1}))
			return err
		}},
		{"info count mismatch", ErrInvalid, func() error {
			_, err := ParseOption(AppendOption(nil, OptInfo, []byte{0, 0, 0, 0, 0, 5, 0, 1}))
			return err
		}},
		{"meta query count huge", ErrShort, func() error {
			_, err := ParseOption(AppendOption(nil, OptSetMetaContext, []byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}))
			return err
		}},
		{"abort with data", ErrInvalid, func() error { _, err := ParseOption(AppendOption(nil, OptAbort, []byte{1})); return err }},
		{"structured reply with data", ErrInvalid, func() error {
			_, err := ParseOption(AppendOption(nil, OptStructuredReply, []byte{1}))
			return err
		}},
		{"greeting oldstyle", ErrBadMagic, func() error {
			b := AppendServerGreeting(nil, 0)
			copy(b[8:], []byte{0, 0, 0x42, 0x02, 0x81, 0x86, 0x12, 0x53})
			_, err := ParseServerGreeting(b)
			return err
		}},
		{"hole zero length", ErrInvalid, func() error { _, _, err := ParseOffsetHole(make([]byte, 12)); return err }},
		{"block status ragged", ErrInvalid, func() error { _, _, err := ParseBlockStatus(make([]byte, 13), nil); return err }},
		{"error chunk message overrun", ErrShort, func() error {
			_, err := ParseErrorChunk(ReplyTypeError, []byte{0, 0, 0, 22, 0, 9, 'x'})
			return err
		}},
		{"error chunk zero errno", ErrInvalid, func() error {
			_, err := ParseErrorChunk(ReplyTypeError, []byte{0, 0, 0, 0, 0, 0})
			return err
		}},
	}
	for _, c := range cases {
		if err := c.fn(); !errors.Is(err, c.err) {
			t.Errorf("%s: got %v want %v", c.name, err, c.err)
		}
	}
}

func TestOptionRoundTrip(t *testing.T) {
	cases := []Option{
		{Opt: OptGo, Name: "vol1", InfoRequests: []InfoType{InfoBlockSize, InfoName, 77}},
		{Opt: OptInfo, Name: ""},
		{Opt: OptSetMetaContext, Name: "x", Queries: []string{"base:allocation", "qemu:dirty-bitmap:a"}},
		{Opt: OptListMetaContext, Name: "x"},
	}
	for _, o := range cases {
		var data []byte
		switch o.Opt {
		case OptGo, OptInfo:
			data = AppendInfoRequest(nil, o.Name, o.InfoRequests)
		default:
			data = AppendMetaContextRequest(nil, o.Name, o.Queries)
		}
		got, err := ParseOption(AppendOption(nil, o.Opt, data))
		if err != nil {
			t.Fatal(err)
		}
		got.Data = nil
		if !reflect.DeepEqual(got, o) {
			t.Errorf("round trip %+v -> %+v", o, got)
		}
	}
	got, err := ParseOption(AppendOption(nil, OptExportName, []byte("default")))
	if err != nil || got.Name != "default" {
		t.Errorf("export name %+v %v", got, err)
	}
	// Unknown options decode without error so the server can answer ERR_UNSUP.
	got, err = ParseOption(AppendOption(nil, 999, []byte{1, 2, 3}))
	if err != nil || got.Opt != 999 || !bytes.Equal(got.Data, []byte{1, 2, 3}) {
		t.Errorf("unknown %+v %v", got, err)
	}
}

func TestRepliesRoundTrip(t *testing.T) {
	b := AppendErrorChunk(nil, ReplyFlagDone, 9, EIO, "disk on fire")
	h, err := ParseChunkHeader(b)
	if err != nil || h.Type != ReplyTypeError || h.Cookie != 9 || h.Flags != ReplyFlagDone || int(h.Length) != len(b)-ChunkHeaderSize {
		t.Fatalf("%+v %v", h, err)
	}
	ce, err := ParseErrorChunk(h.Type, b[ChunkHeaderSize:])
	if err != nil || ce.Errno != EIO || ce.Message != "disk on fire" {
		t.Errorf("%+v %v", ce, err)
	}
	sr, err := ParseSimpleReply(AppendSimpleReply(nil, SimpleReply{Error: ENOSPC, Cookie: 3}))
	if err != nil || sr.Error != ENOSPC || sr.Cookie != 3 {
		t.Errorf("%+v %v", sr, err)
	}
	for _, in := range []Info{
		{Type: InfoExport, Export: ExportInfo{Size: 10 << 30, Flags: FlagHasFlags | FlagReadOnly}},
		{Type: InfoBlockSize, BlockSize: BlockSize{1, 4096, 32 << 20}},
		{Type: InfoName, Text: "n"},
		{Type: InfoDescription, Text: "d"},
	} {
		var data []byte
		switch in.Type {
		case InfoExport:
			data = AppendInfoExport(nil, in.Export)
		case InfoBlockSize:
			data = AppendInfoBlockSize(nil, in.BlockSize)
		default:
			data = AppendInfoString(nil, in.Type, in.Text)
		}
		got, err := ParseInfo(data)
		if err != nil || got != in {
			t.Errorf("%+v -> %+v %v", in, got, err)
		}
	}
	enr := AppendExportNameReply(nil, ExportInfo{Size: 5, Flags: 1}, false)
	if len(enr) != 10+ExportNameZeroesSize {
		t.Errorf("export name reply %d bytes", len(enr))
	}
	if len(AppendExportNameReply(nil, ExportInfo{}, true)) != 10 {
		t.Error("NO_ZEROES reply not 10 bytes")
	}
}

func TestErrnoNames(t *testing.T) {
	for e, s := range map[Errno]string{EPERM: "NBD_EPERM", EIO: "NBD_EIO", ENOMEM: "NBD_ENOMEM", EINVAL: "NBD_EINVAL",
		ENOSPC: "NBD_ENOSPC", EOVERFLOW: "NBD_EOVERFLOW", ENOTSUP: "NBD_ENOTSUP", ESHUTDOWN: "NBD_ESHUTDOWN"} {
		if e.String() != s || !e.Known() {
			t.Errorf("%d: %q", uint32(e), e.String())
		}
	}
	if Errno(7).Known() {
		t.Error("7 known")
	}
	var err error = EINVAL
	var en Errno
	if !errors.As(err, &en) || en != EINVAL {
		t.Error("errors.As")
	}
	if RepErrTLSReqd.String() != "NBD_REP_ERR_TLS_REQD" || !RepErrTLSReqd.IsError() || RepAck.IsError() {
		t.Error("rep names")
	}
	if uint32(RepErrTooBig) != 1<<31+9 || ReplyTypeErrorOffset != 32770 {
		t.Error("constant values")
	}
}
