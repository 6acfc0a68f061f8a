package repl

import (
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/alignbuf"
)

var rewrite = flag.Bool("rewrite", false, "rewrite expected outputs in testdata/")

// simNode is one node of the simulated pair: the state machine, an
// in-memory disk, persisted state, and held local I/O.
type simNode struct {
	name   string
	cfg    Config
	n      *Node
	disk   []byte
	meta   Meta
	bm     []uint64
	al     []int64
	holdIO bool
	// holdFlush: flushes do not complete (writes do) until release-flush,
	// so a test sees what waits for durability.
	holdFlush bool
	flushes   []Apply
	applies   []Apply
	reads     []Read
	rel       []string
	failIO    bool
	gen       uint64
	discs     []string
}

// sim is two nodes and a network with two channels per direction.
type sim struct {
	nodes   map[string]*simNode
	queues  map[string][]Message // "a>b" data, "a>b!" control
	linkUp  bool
	blocked map[string]bool // queue keys not delivered (blackhole)
	nextVal byte
}

func (s *sim) peer(name string) string {
	if name == "a" {
		return "b"
	}
	return "a"
}

func parseSize(v string) int64 {
	if v == "" {
		return 0
	}
	mul := int64(1)
	switch {
	case strings.HasSuffix(v, "K"):
		mul, v = 1<<10, strings.TrimSuffix(v, "K")
	case strings.HasSuffix(v, "M"):
		mul, v = 1<<20, strings.TrimSuffix(v, "M")
	}
	x, err := strconv.ParseInt(v, 0, 64)
	if err != nil {
		panic(err)
	}
	return x * mul
}

func (s *sim) newNode(name string, args map[string]string) {
	size := parseSize(args["size"])
	proto, _ := ParseProtocol(args["proto"])
	sb, err := ParseSplitBrainPolicy(args["sb"])
	if err != nil {
		panic(err)
	}
	sn := &simNode{name: name, disk: make([]byte, size)}
	sn.gen = uint64(name[0]) << 8
	sn.cfg = Config{NodeID: uint64(name[0]), Size: size, Protocol: proto, SplitBrain: sb,
		PingInterval: 5, PingTimeout: 20, KoTicks: 30, ALExtents: 2, Checksum: args["csum"] == "1"}
	if v, ok := args["rate"]; ok {
		sn.cfg.ResyncRate = parseSize(v)
	}
	if v, ok := args["minrate"]; ok {
		sn.cfg.ResyncMinRate = parseSize(v)
	}
	if v, ok := args["inflight"]; ok {
		sn.cfg.ResyncInflight = int(parseSize(v))
	}
	sn.cfg.Rand = func() uint64 { sn.gen++; return sn.gen }
	sn.meta = Meta{Disk: Inconsistent}
	if args["disk"] == "UpToDate" {
		sn.meta.Disk = UpToDate
	}
	sn.meta.Clean = true
	sn.n = NewNode(sn.cfg, sn.meta, nil, nil)
	s.nodes[name] = sn
}

// process drains a node's Ready following the documented order.
func (s *sim) process(sn *simNode) bool {
	did := false
	for sn.n.HasReady() {
		did = true
		rd := sn.n.Ready()
		if rd.Persist.Meta != nil {
			sn.meta = *rd.Persist.Meta
		}
		if rd.Persist.ALChanged {
			sn.al = rd.Persist.AL
		}
		if rd.Persist.BitmapChanged {
			sn.bm = rd.Persist.Bitmap
		}
		for _, m := range rd.Send {
			if !s.linkUp {
				continue
			}
			k := sn.name + ">" + s.peer(sn.name)
			if m.Type.Control() {
				k += "!"
			}
			// Encode+decode every message: the codec is exercised by every
			// scenario, and the receiver never shares the sender's buffers.
			b := AppendEncode(nil, &m)
			dm, nn, err := Decode(b)
			if err != nil || nn != len(b) {
				panic(fmt.Sprintf("codec: %v", err))
			}
			s.queues[k] = append(s.queues[k], dm)
		}
		sn.applies = append(sn.applies, rd.Apply...)
		sn.reads = append(sn.reads, rd.Reads...)
		for _, r := range rd.Release {
			e := "ok"
			if r.Err != nil {
				e = r.Err.Error()
			}
			sn.rel = append(sn.rel, fmt.Sprintf("%d:%s", r.ID, e))
		}
		if rd.Disconnect != "" {
			sn.discs = append(sn.discs, rd.Disconnect)
			s.cut()
		}
	}
	return did
}

func (s *sim) cut() {
	if !s.linkUp {
		return
	}
	s.linkUp = false
	s.queues = map[string][]Message{}
	for _, sn := range s.nodes {
		sn.n.Disconnect("link down")
	}
}

func (s *sim) doIO(sn *simNode) bool {
	if sn.holdIO {
		return false
	}
	did := false
	for len(sn.applies) > 0 || len(sn.reads) > 0 {
		did = true
		as := sn.applies
		sn.applies = nil
		for _, a := range as {
			if a.Op == OpFlush && sn.holdFlush {
				sn.flushes = append(sn.flushes, a)
				continue
			}
			var err error
			if sn.failIO {
				err = fmt.Errorf("injected I/O error")
			} else {
				switch a.Op {
				case OpWrite:
					copy(sn.disk[a.Offset:], a.Data)
				case OpTrim, OpZero:
					clear(sn.disk[a.Offset : a.Offset+a.Length])
				}
			}
			sn.n.LocalDone(a.ID, err)
		}
		rs := sn.reads
		sn.reads = nil
		for _, r := range rs {
			sn.n.ReadDone(r.ID, readPieces(sn.disk, r), nil)
		}
	}
	return did
}

// readPieces models the driver's resync read: zero runs at 64 KiB
// granularity become Zero pieces.
func readPieces(disk []byte, r Read) []ReadPiece {
	if !r.NeedData {
		b := disk[r.Offset : r.Offset+r.Length]
		return []ReadPiece{{Offset: r.Offset, Length: r.Length, Zero: alignbuf.IsZero(b), Hash: sha256.Sum256(b)}}
	}
	var out []ReadPiece
	for off := r.Offset; off < r.Offset+r.Length; {
		l := min(int64(ChunkSize), r.Offset+r.Length-off)
		b := disk[off : off+l]
		z := alignbuf.IsZero(b)
		if n := len(out); n > 0 && out[n-1].Zero == z && (z || !r.WantHash) && out[n-1].Offset+out[n-1].Length == off {
			out[n-1].Length += l
			if !z {
				out[n-1].Data = disk[out[n-1].Offset : off+l]
			}
		} else {
			p := ReadPiece{Offset: off, Length: l, Zero: z}
			if !z {
				p.Data = b
			}
			out = append(out, p)
		}
		off += l
	}
	for i := range out {
		out[i].Data = append([]byte(nil), out[i].Data...)
		out[i].Hash = sha256.Sum256(disk[out[i].Offset : out[i].Offset+out[i].Length])
	}
	return out
}

// deliver moves queued messages (control first) until the network is idle.
func (s *sim) deliver() bool {
	did := false
	for _, k := range []string{"a>b!", "b>a!", "a>b", "b>a"} {
		if s.blocked[k] {
			continue
		}
		q := s.queues[k]
		if len(q) == 0 {
			continue
		}
		s.queues[k] = nil
		to := s.nodes[k[2:3]]
		for _, m := range q {
			if !s.linkUp {
				break
			}
			to.n.Step(m)
		}
		did = true
	}
	return did
}

func (s *sim) stabilize() {
	for i := 0; i < 100000; i++ {
		did := false
		for _, name := range []string{"a", "b"} {
			if sn := s.nodes[name]; sn != nil {
				did = s.process(sn) || did
				did = s.doIO(sn) || did
				did = s.process(sn) || did
			}
		}
		did = s.deliver() || did
		if !did {
			return
		}
	}
	panic("no quiescence")
}

func status(sn *simNode) string {
	st := sn.n.Status()
	g := st.Gens
	s := fmt.Sprintf("%s: %s/%s %s peer=%s/%s gens=%s oos=%d", sn.name, st.Role, st.Disk, st.Conn, st.PeerRole, st.PeerDisk, g, st.OutOfSync)
	if st.LastError != "" {
		s += " err=" + st.LastError
	}
	return s
}

func (s *sim) run(t *testing.T, cmd string, args []string) string {
	kv := map[string]string{}
	var pos []string
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			kv[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	node := func() *simNode {
		if len(pos) == 0 {
			t.Fatalf("%s: node name missing", cmd)
		}
		return s.nodes[pos[0]]
	}
	var out []string
	switch cmd {
	case "new":
		s.newNode(pos[0], kv)
	case "connect":
		s.linkUp = true
		s.queues = map[string][]Message{}
		s.nodes["a"].n.Listen()
		s.nodes["b"].n.Listen()
		s.nodes["a"].n.Connect()
		s.nodes["b"].n.Connect()
		s.stabilize()
	case "cut":
		s.cut()
		s.stabilize()
	case "block":
		s.blocked[pos[0]] = true
	case "unblock":
		delete(s.blocked, pos[0])
	case "promote":
		err := node().n.Promote(kv["force"] == "1", parseSize(kv["at"]))
		out = append(out, fmt.Sprintf("promote %s: %v", pos[0], err))
		s.stabilize()
	case "demote":
		node().n.Demote()
		s.stabilize()
	case "retune":
		// retune a ping_timeout=N ko=N ...: the node's tunables in place
		// (unset keys: the node's current value).
		sn := node()
		c := sn.n.cfg
		tn := Tunables{PingInterval: c.PingInterval, PingTimeout: c.PingTimeout, KoTicks: c.KoTicks, ALRetireTicks: c.ALRetireTicks,
			ResyncRate: c.ResyncRate, ResyncMinRate: c.ResyncMinRate}
		if v, ok := kv["ping_timeout"]; ok {
			tn.PingTimeout = int(parseSize(v))
		}
		if v, ok := kv["ko"]; ok {
			tn.KoTicks = int(parseSize(v))
		}
		if v, ok := kv["rate"]; ok {
			tn.ResyncRate = parseSize(v)
		}
		sn.n.Retune(tn)
	case "write", "trim", "flush":
		sn := node()
		w := Write{Op: OpWrite}
		if cmd == "trim" {
			w.Op = OpTrim
		}
		if cmd == "flush" {
			w.Op = OpFlush
		} else {
			w.Offset, w.Length = parseSize(kv["off"]), parseSize(kv["len"])
		}
		if w.Op == OpWrite {
			s.nextVal++
			v := s.nextVal
			if x, ok := kv["val"]; ok {
				v = byte(parseSize(x))
			}
			w.Data = bytes.Repeat([]byte{v}, int(w.Length))
		}
		count := 1
		if c, ok := kv["count"]; ok {
			count = int(parseSize(c))
		}
		for i := 0; i < count; i++ {
			ww := w
			stride := w.Length
			if st, ok := kv["stride"]; ok {
				stride = parseSize(st)
			}
			ww.Offset += int64(i) * stride
			_, err := sn.n.Propose(ww)
			if err != nil {
				out = append(out, fmt.Sprintf("%s: %v", cmd, err))
				break
			}
			s.process(sn)
		}
		if kv["nostab"] != "1" {
			s.stabilize()
		}
	case "hold":
		node().holdIO = true
	case "hold-flush":
		node().holdFlush = true
	case "release-flush":
		sn := node()
		sn.holdFlush = false
		sn.applies = append(sn.flushes, sn.applies...)
		sn.flushes = nil
		s.stabilize()
	case "progress":
		for _, name := range pos {
			st := s.nodes[name].n.Status()
			out = append(out, fmt.Sprintf("%s: %s total=%d left=%d discard-my-data=%v", name, st.Conn, st.ResyncTotal, st.ResyncLeft, st.DiscardMyData))
		}
	case "connect-discard":
		err := node().n.ConnectDiscardMyData()
		out = append(out, fmt.Sprintf("connect-discard %s: %v", pos[0], err))
	case "release-io":
		node().holdIO = false
		s.stabilize()
	case "fail-io":
		node().failIO = kv["on"] != "0"
	case "stabilize":
		s.stabilize()
	case "tick":
		k := int(parseSize(kv["n"]))
		for i := 0; i < k; i++ {
			for _, name := range pos {
				s.nodes[name].n.Tick()
			}
			s.stabilize()
		}
	case "releases":
		sn := node()
		out = append(out, fmt.Sprintf("%s released: %s", sn.name, strings.Join(sn.rel, " ")))
		sn.rel = nil
	case "disconnects":
		sn := node()
		out = append(out, fmt.Sprintf("%s disconnects: %q", sn.name, sn.discs))
		sn.discs = nil
	case "status":
		for _, name := range pos {
			out = append(out, status(s.nodes[name]))
		}
	case "stats":
		st := node().n.Status().Stats
		out = append(out, fmt.Sprintf("%s: resync=%d zero=%d hashmatch=%d verified=%d diff=%d sent=%d recv=%d",
			pos[0], st.ResyncBytes, st.ResyncZeroBytes, st.ResyncHashMatchBytes, st.VerifiedBytes, st.VerifyDiff, st.SentBytes, st.ReceivedData))
	case "decision":
		d := node().n.Status().LastDecision
		out = append(out, fmt.Sprintf("%s: %v rule=%d resolved=%v", pos[0], d.Kind, d.Rule, d.Resolved))
	case "reason":
		out = append(out, fmt.Sprintf("%s: %s", pos[0], node().n.Status().LastDecision.Reason))
	case "compare":
		a, b := s.nodes["a"].disk, s.nodes["b"].disk
		if bytes.Equal(a, b) {
			out = append(out, "disks equal")
		} else {
			var diff []string
			for off := 0; off < len(a); off += ChunkSize {
				if !bytes.Equal(a[off:off+ChunkSize], b[off:off+ChunkSize]) {
					diff = append(diff, strconv.Itoa(off/ChunkSize))
				}
			}
			out = append(out, "disks differ in chunks "+strings.Join(diff, ","))
		}
	case "crash":
		// Process death: everything not persisted is lost; held I/O never
		// happens. Restart from what was persisted.
		sn := node()
		s.cut()
		sn.applies, sn.reads, sn.holdIO = nil, nil, false
		sn.flushes, sn.holdFlush = nil, false
		sn.n = NewNode(sn.cfg, sn.meta, sn.bm, sn.al)
		s.stabilize()
		out = append(out, fmt.Sprintf("%s restarted: oos=%d", sn.name, sn.n.Status().OutOfSync))
	case "restart":
		// Clean stop and start: Shutdown persisted, then a new Node.
		sn := node()
		sn.n.Shutdown()
		s.process(sn)
		sn.applies, sn.reads, sn.holdIO = nil, nil, false
		sn.n = NewNode(sn.cfg, sn.meta, sn.bm, sn.al)
		s.stabilize()
		out = append(out, status(sn))
	case "shutdown":
		sn := node()
		sn.n.Shutdown()
		s.process(sn)
	case "corrupt":
		sn := node()
		off := parseSize(kv["off"])
		sn.disk[off] ^= 0xff
	case "verify":
		err := node().n.StartVerify()
		out = append(out, fmt.Sprintf("verify %s: %v", pos[0], err))
		s.stabilize()
	case "al":
		out = append(out, fmt.Sprintf("%s al=%v", pos[0], node().al))
	default:
		t.Fatalf("unknown command %q", cmd)
	}
	return strings.Join(out, "\n")
}

// TestScenarios replays every testdata/*.txt file: "command args" lines,
// each followed by "----" and the expected output (datadriven style).
func TestScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	sort.Strings(files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScenario(t, f) })
	}
}

func runScenario(t *testing.T, path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	s := &sim{nodes: map[string]*simNode{}, queues: map[string][]Message{}, blocked: map[string]bool{}}
	var outFile strings.Builder
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trim := strings.TrimSpace(line)
		if trim == "" || strings.HasPrefix(trim, "#") {
			outFile.WriteString(line + "\n")
			continue
		}
		fields := strings.Fields(trim)
		got := s.run(t, fields[0], fields[1:])
		outFile.WriteString(line + "\n")
		// Expected block: "----" then lines until a blank line.
		var want []string
		if i+1 < len(lines) && strings.TrimSpace(lines[i+1]) == "----" {
			i += 2
			for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
				want = append(want, lines[i])
			}
			i-- // the blank line is handled by the loop
		}
		if got != "" || len(want) > 0 {
			outFile.WriteString("----\n")
			if got != "" {
				outFile.WriteString(got + "\n")
			}
			// A blank line ends an expected block.
			if i+1 < len(lines) && strings.TrimSpace(lines[i+1]) != "" {
				outFile.WriteString("\n")
			}
		}
		if !*rewrite && got != strings.Join(want, "\n") {
			t.Errorf("%s:%d: %s\n got:\n%s\nwant:\n%s", path, i+1, trim, got, strings.Join(want, "\n"))
		}
	}
	if *rewrite {
		os.WriteFile(path, []byte(strings.TrimRight(outFile.String(), "\n")+"\n"), 0o644)
	}
}
