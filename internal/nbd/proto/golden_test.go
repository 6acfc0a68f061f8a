package proto

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// session is one captured connection: the client→server and server→client
// byte streams.
type session struct{ c, s []byte }

// loadTranscript reads a testdata transcript written by
// testdata/capture/proxy.go (see the header of each file for its origin).
func loadTranscript(t testing.TB, name string) []session {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []session
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4<<20), 4<<20)
	greeting := hex.EncodeToString(AppendServerGreeting(nil, 0)[:16])
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		dir, h, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("%s: bad line %q", name, line)
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if dir == "S" && strings.HasPrefix(h, greeting) || len(out) == 0 {
			out = append(out, session{})
		}
		cur := &out[len(out)-1]
		switch dir {
		case "C":
			cur.c = append(cur.c, b...)
		case "S":
			cur.s = append(cur.s, b...)
		default:
			t.Fatalf("%s: bad direction %q", name, dir)
		}
	}
	return out
}

// decoded is what walking one captured session yields.
type decoded struct {
	options  []Option
	reqs     []Request
	optReps  []OptionReplyHeader
	infos    []Info
	contexts []string
	chunks   []ChunkHeader
	simple   []SimpleReply
	holes    [][2]uint64
	status   []BlockDescriptor
	readData map[uint64][]byte // OFFSET_DATA payloads by offset
	servers  []string
	hsFlags  uint16
}

// walk decodes a captured session message by message and checks that
// re-encoding every message with this package reproduces the captured bytes
// exactly.
func walk(t *testing.T, s session) decoded {
	t.Helper()
	d := decoded{readData: map[uint64][]byte{}}
	same := func(what string, got, want []byte) {
		t.Helper()
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: re-encoded\n%x\nwant captured\n%x", what, got, want)
		}
	}
	// --- client stream ---
	c := s.c
	if _, err := ParseClientFlags(c); err != nil {
		t.Fatal(err)
	}
	c = c[ClientFlagsSize:]
	structured := false
	for len(c) > 0 {
		h, err := ParseOptionHeader(c)
		if err != nil {
			t.Fatalf("option header: %v", err)
		}
		n := OptionHeaderSize + int(h.Length)
		o, err := ParseOption(c[:n])
		if err != nil {
			t.Fatalf("ParseOption(%x): %v", c[:n], err)
		}
		var re []byte
		switch o.Opt {
		case OptInfo, OptGo:
			re = AppendOption(nil, o.Opt, AppendInfoRequest(nil, o.Name, o.InfoRequests))
		case OptListMetaContext, OptSetMetaContext:
			re = AppendOption(nil, o.Opt, AppendMetaContextRequest(nil, o.Name, o.Queries))
		case OptExportName:
			re = AppendOption(nil, o.Opt, []byte(o.Name))
		default:
			re = AppendOption(nil, o.Opt, o.Data)
		}
		same(o.Opt.String(), re, c[:n])
		d.options = append(d.options, o)
		c = c[n:]
		if o.Opt == OptStructuredReply {
			structured = true
		}
		if o.Opt == OptGo || o.Opt == OptExportName {
			break
		}
	}
	readLen := map[uint64]uint32{}
	for len(c) > 0 {
		r, err := ParseRequest(c)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		same(r.Type.String(), AppendRequest(nil, r), c[:RequestSize])
		c = c[RequestSize:]
		if r.Type == CmdWrite {
			c = c[r.Length:]
		}
		if r.Type == CmdRead {
			readLen[r.Cookie] = r.Length
		}
		d.reqs = append(d.reqs, r)
	}
	// --- server stream ---
	sv := s.s
	fl, err := ParseServerGreeting(sv)
	if err != nil {
		t.Fatal(err)
	}
	d.hsFlags = fl
	same("greeting", AppendServerGreeting(nil, fl), sv[:ServerGreetingSize])
	sv = sv[ServerGreetingSize:]
	for len(sv) > 0 {
		h, err := ParseOptionReplyHeader(sv)
		if err != nil {
			t.Fatalf("option reply: %v", err)
		}
		data := sv[OptionReplyHdrSize : OptionReplyHdrSize+int(h.Length)]
		same("option reply "+h.Type.String(), AppendOptionReply(nil, h.Opt, h.Type, data), sv[:OptionReplyHdrSize+int(h.Length)])
		d.optReps = append(d.optReps, h)
		switch h.Type {
		case RepInfo:
			in, err := ParseInfo(data)
			if err != nil {
				t.Fatal(err)
			}
			var re []byte
			switch in.Type {
			case InfoExport:
				re = AppendInfoExport(nil, in.Export)
			case InfoBlockSize:
				re = AppendInfoBlockSize(nil, in.BlockSize)
			default:
				re = AppendInfoString(nil, in.Type, in.Text)
			}
			same(in.Type.String(), re, data)
			d.infos = append(d.infos, in)
		case RepMetaContext:
			id, name, err := ParseRepMetaContext(data)
			if err != nil {
				t.Fatal(err)
			}
			same("meta context", AppendRepMetaContext(nil, id, name), data)
			d.contexts = append(d.contexts, name)
		case RepServer:
			name, desc, err := ParseRepServer(data)
			if err != nil {
				t.Fatal(err)
			}
			same("rep server", AppendRepServer(nil, name, desc), data)
			d.servers = append(d.servers, name)
		}
		sv = sv[OptionReplyHdrSize+int(h.Length):]
		if (h.Opt == OptGo) && h.Type == RepAck {
			break
		}
	}
	for len(sv) > 0 {
		m, _ := ReplyMagic(sv)
		switch m {
		case SimpleReplyMagic:
			r, err := ParseSimpleReply(sv)
			if err != nil {
				t.Fatal(err)
			}
			same("simple reply", AppendSimpleReply(nil, r), sv[:SimpleReplySize])
			sv = sv[SimpleReplySize:]
			if n, ok := readLen[r.Cookie]; ok && !structured && r.Error == 0 {
				sv = sv[n:]
			}
			d.simple = append(d.simple, r)
		case StructuredReplyMagic:
			h, err := ParseChunkHeader(sv)
			if err != nil {
				t.Fatal(err)
			}
			same("chunk header", AppendChunkHeader(nil, h), sv[:ChunkHeaderSize])
			p := sv[ChunkHeaderSize : ChunkHeaderSize+int(h.Length)]
			switch h.Type {
			case ReplyTypeOffsetHole:
				off, size, err := ParseOffsetHole(p)
				if err != nil {
					t.Fatal(err)
				}
				same("hole", AppendOffsetHole(nil, h.Flags, h.Cookie, off, size), sv[:ChunkHeaderSize+12])
				d.holes = append(d.holes, [2]uint64{off, uint64(size)})
			case ReplyTypeOffsetData:
				off, data, err := ParseOffsetDataPrefix(p)
				if err != nil {
					t.Fatal(err)
				}
				same("data header", AppendOffsetDataHeader(nil, h.Flags, h.Cookie, off, uint32(len(data))), sv[:ChunkHeaderSize+8])
				d.readData[off] = data
			case ReplyTypeBlockStatus:
				id, ds, err := ParseBlockStatus(p, nil)
				if err != nil {
					t.Fatal(err)
				}
				same("block status", AppendBlockStatus(nil, h.Flags, h.Cookie, id, ds), sv[:ChunkHeaderSize+int(h.Length)])
				d.status = append(d.status, ds...)
			case ReplyTypeNone:
				same("none", AppendNoneChunk(nil, h.Cookie), sv[:ChunkHeaderSize])
			}
			d.chunks = append(d.chunks, h)
			sv = sv[ChunkHeaderSize+int(h.Length):]
		default:
			t.Fatalf("unexpected reply magic %#x", m)
		}
	}
	return d
}

func TestGoldenNbdkitNbdinfoJSON(t *testing.T) {
	ss := loadTranscript(t, "nbdkit-nbdinfo-json.txt")
	if len(ss) != 1 {
		t.Fatalf("%d sessions", len(ss))
	}
	d := walk(t, ss[0])
	if d.hsFlags != FlagFixedNewstyle|FlagNoZeroes {
		t.Errorf("handshake flags %#x", d.hsFlags)
	}
	wantOpts := []Opt{OptStructuredReply, OptInfo, OptListMetaContext, OptGo}
	if len(d.options) != len(wantOpts) {
		t.Fatalf("options %v", d.options)
	}
	for i, o := range d.options {
		if o.Opt != wantOpts[i] {
			t.Errorf("option %d = %v, want %v", i, o.Opt, wantOpts[i])
		}
	}
	// nbdinfo asks for BLOCK_SIZE, NAME and DESCRIPTION, in that order.
	if got := d.options[1].InfoRequests; len(got) != 3 || got[0] != InfoBlockSize || got[1] != InfoName || got[2] != InfoDescription {
		t.Errorf("info requests %v", got)
	}
	var exp *Info
	for i := range d.infos {
		if d.infos[i].Type == InfoExport {
			exp = &d.infos[i]
		}
	}
	if exp == nil || exp.Export.Size != 1<<20 {
		t.Fatalf("export info %+v", exp)
	}
	// nbdkit memory: HAS_FLAGS|SEND_FLUSH|SEND_FUA|SEND_TRIM|SEND_WRITE_ZEROES|SEND_DF|CAN_MULTI_CONN|SEND_CACHE|SEND_FAST_ZERO
	want := FlagHasFlags | FlagSendFlush | FlagSendFUA | FlagSendTrim | FlagSendWriteZeroes | FlagSendDF | FlagCanMultiConn | FlagSendCache | FlagSendFastZero
	if exp.Export.Flags != want {
		t.Errorf("transmission flags %#x want %#x", exp.Export.Flags, want)
	}
	if len(d.contexts) != 1 || d.contexts[0] != MetaContextBaseAllocation {
		t.Errorf("contexts %v", d.contexts)
	}
	if len(d.reqs) != 2 || d.reqs[0].Type != CmdRead || d.reqs[1].Type != CmdDisc {
		t.Errorf("requests %+v", d.reqs)
	}
}

func TestGoldenNbdkitQemuIO(t *testing.T) {
	ss := loadTranscript(t, "nbdkit-qemu-io.txt")
	d := walk(t, ss[0])
	var types []Cmd
	for _, r := range d.reqs {
		types = append(types, r.Type)
	}
	want := []Cmd{CmdWrite, CmdRead, CmdTrim, CmdWriteZeroes, CmdFlush, CmdFlush, CmdDisc}
	if len(types) != len(want) {
		t.Fatalf("requests %v want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("requests %v want %v", types, want)
		}
	}
	if r := d.reqs[0]; r.Offset != 4096 || r.Length != 4096 || r.Flags != CmdFlagFUA {
		t.Errorf("write %+v", r)
	}
	if r := d.reqs[3]; r.Offset != 8192 || r.Flags != CmdFlagFUA|CmdFlagNoHole {
		t.Errorf("write zeroes %+v", r)
	}
	data := d.readData[4096]
	if len(data) != 4096 || bytes.Count(data, []byte{0xab}) != 4096 {
		t.Errorf("read data %d bytes", len(data))
	}
	for _, r := range d.simple {
		if r.Error != 0 {
			t.Errorf("error reply %v", r.Error)
		}
	}
}

func TestGoldenNbdkitMap(t *testing.T) {
	d := walk(t, loadTranscript(t, "nbdkit-nbdinfo-map.txt")[0])
	var total uint64
	for _, s := range d.status {
		total += uint64(s.Length)
	}
	// nbdinfo printed: 0 32768 data; 32768 1015808 hole,zero.
	if len(d.status) != 2 || d.status[0] != (BlockDescriptor{32768, 0}) || d.status[1] != (BlockDescriptor{1015808, StateHole | StateZero}) {
		t.Errorf("status %+v", d.status)
	}
	if total != 1<<20 {
		t.Errorf("extents cover %d", total)
	}
}

func TestGoldenQemuNbdList(t *testing.T) {
	d := walk(t, loadTranscript(t, "qemu-nbd-nbdinfo-list.txt")[0])
	if len(d.servers) != 1 || d.servers[0] != "disk" {
		t.Errorf("servers %v", d.servers)
	}
}

func TestGoldenQemuNbdHoles(t *testing.T) {
	ss := loadTranscript(t, "qemu-nbd-map-read.txt")
	if len(ss) != 2 {
		t.Fatalf("%d sessions", len(ss))
	}
	m := walk(t, ss[0])
	want := []BlockDescriptor{{65536, 3}, {4096, 0}, {978944, 3}}
	if len(m.status) != 3 || m.status[0] != want[0] || m.status[1] != want[1] || m.status[2] != want[2] {
		t.Errorf("status %+v", m.status)
	}
	var desc string
	for _, in := range m.infos {
		if in.Type == InfoDescription {
			desc = in.Text
		}
	}
	if desc != "test disk" {
		t.Errorf("description %q", desc)
	}
	r := walk(t, ss[1])
	// qemu-io read 0..131072: hole, 4 KiB of data at 65536, hole.
	if len(r.holes) != 2 || r.holes[0] != [2]uint64{0, 65536} || r.holes[1] != [2]uint64{69632, 61440} {
		t.Errorf("holes %v", r.holes)
	}
	if d := r.readData[65536]; !bytes.HasPrefix(d, []byte("hello")) || len(d) != 4096 {
		t.Errorf("data chunk %d bytes %q", len(d), d[:min(8, len(d))])
	}
}
