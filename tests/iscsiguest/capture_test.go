package iscsiguest_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

// capProxy forwards TCP connections to a target and keeps both byte
// streams of every connection, with the time each chunk passed, so that
// the test can split them into PDUs with vmsan's own codec afterwards
// (internal/iscsi/pdu reading what open-iscsi and the target really
// sent). Memory grows with the traffic: use it for short sessions.
type capProxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []*capConn
	open  []net.Conn
}

// capConn is one proxied connection: streams[0] initiator->target,
// streams[1] target->initiator.
type capConn struct {
	mu      sync.Mutex
	streams [2]bytes.Buffer
	chunks  []capChunk
}

type capChunk struct {
	dir int
	off int // offset of the chunk in its stream
	at  time.Time
}

func newCapProxy(target string) (*capProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &capProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *capProxy) Addr() string { return p.ln.Addr().String() }

func (p *capProxy) accept() {
	defer p.wg.Done()
	for {
		a, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			a.Close()
			continue
		}
		c := &capConn{}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.open = append(p.open, a, b)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, 0, a, b)
		go p.pipe(c, 1, b, a)
	}
}

// pipe copies src to dst, recording what passes; when either side ends,
// both are closed (the other pipe then ends too).
func (p *capProxy) pipe(c *capConn, dir int, src, dst net.Conn) {
	defer p.wg.Done()
	io.Copy(dst, io.TeeReader(src, capWriter{c, dir}))
	src.Close()
	dst.Close()
}

type capWriter struct {
	c   *capConn
	dir int
}

func (w capWriter) Write(b []byte) (int, error) {
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	w.c.chunks = append(w.c.chunks, capChunk{dir: w.dir, off: w.c.streams[w.dir].Len(), at: time.Now()})
	return w.c.streams[w.dir].Write(b)
}

// Close stops accepting, closes every connection and waits for the pipes.
func (p *capProxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// capPDU is one PDU as captured.
type capPDU struct {
	Conn  int    // connection number, in accept order
	Dir   string // "C" initiator->target, "S" target->initiator
	Raw   []byte // the whole PDU as on the wire
	Frame pdu.Frame
	at    time.Time
}

// PDUs splits every captured stream into PDUs with pdu.Reader (no
// digests: neither side here negotiates them) and returns them in the
// order they passed the proxy. An error is a stream the codec cannot
// frame or decode: a bug in the codec or in the capture.
func (p *capProxy) PDUs() ([]capPDU, error) {
	p.mu.Lock()
	conns := append([]*capConn(nil), p.conns...)
	p.mu.Unlock()
	var all []capPDU
	for ci, c := range conns {
		c.mu.Lock()
		for dir := range 2 {
			stream := c.streams[dir].Bytes()
			cr := &countReader{r: bytes.NewReader(stream)}
			// The largest data segment the RFC allows (2^24-1): the
			// capture checks framing, not the negotiated limits.
			r := pdu.Reader{R: cr, MaxData: 1<<24 - 1}
			for {
				start := cr.n
				f, err := r.Read()
				if errors.Is(err, io.EOF) && cr.n == start {
					break
				}
				if err != nil {
					c.mu.Unlock()
					return nil, fmt.Errorf("connection %d, %s stream at byte %d of %d: %w", ci, []string{"initiator", "target"}[dir], start, len(stream), err)
				}
				all = append(all, capPDU{Conn: ci, Dir: []string{"C", "S"}[dir], Raw: stream[start:cr.n], Frame: f, at: chunkTime(c.chunks, dir, start)})
			}
		}
		c.mu.Unlock()
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].Conn != all[j].Conn {
			return all[i].Conn < all[j].Conn
		}
		return all[i].at.Before(all[j].at)
	})
	return all, nil
}

// chunkTime is when the byte at off of stream dir passed the proxy.
func chunkTime(chunks []capChunk, dir, off int) time.Time {
	var t time.Time
	for _, ch := range chunks {
		if ch.dir == dir && ch.off <= off {
			t = ch.at
		}
	}
	return t
}

type countReader struct {
	r io.Reader
	n int
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += n
	return n, err
}

// writeCapture writes the PDUs in the format of
// internal/iscsi/pdu/testdata (one PDU per line, "C"/"S" and hex, after
// "#" header lines), leaving out PDUs with more than 512 bytes of data
// (the bulk Data-In/Data-Out of the pattern I/O) so the file stays small.
func writeCapture(path string, header []string, pdus []capPDU) error {
	var b strings.Builder
	for _, h := range header {
		b.WriteString("# " + h + "\n")
	}
	b.WriteString("# One PDU per line, no digests negotiated: C = initiator->target, S = target->initiator.\n")
	b.WriteString("# PDUs with more than 512 bytes of data are left out; \"# conn N\" starts each TCP connection.\n")
	conn := -1
	for _, p := range pdus {
		if p.Conn != conn {
			conn = p.Conn
			fmt.Fprintf(&b, "# conn %d\n", conn)
		}
		if len(p.Frame.Data) > 512 {
			continue
		}
		b.WriteString(p.Dir + " " + hex.EncodeToString(p.Raw) + "\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// goldenConn is one captured connection as a golden vector file of
// internal/iscsi/pdu/testdata.
type goldenConn struct {
	name  string // openiscsi-TARGET-WHAT.txt
	about string // header line: what the connection is
	pdus  []capPDU
}

// goldenConns picks the connections of a TestGuestLogin capture that make
// golden vectors, named by what they are: the discovery sessions (the
// refused one and the one that listed the target), the refused CHAP login,
// the first session's login and logout (open-iscsi's operational offer
// from iscsid.conf; its bulk I/O is left out), the session that came back
// after kill -9 (its login only: reinstatement of the same ISID), and the
// whole small-burst session (every PDU 512 data bytes at most). Each kind
// is taken once, the first connection of it.
func goldenConns(kind string, pdus []capPDU) []goldenConn {
	byConn := map[int][]capPDU{}
	var order []int
	for _, p := range pdus {
		if _, ok := byConn[p.Conn]; !ok {
			order = append(order, p.Conn)
		}
		byConn[p.Conn] = append(byConn[p.Conn], p)
	}
	var out []goldenConn
	taken := map[string]bool{}
	add := func(what, about string, ps []capPDU) {
		if taken[what] || len(ps) == 0 {
			return
		}
		taken[what] = true
		out = append(out, goldenConn{name: "openiscsi-" + kind + "-" + what + ".txt", about: about, pdus: ps})
	}
	var lastISID pdu.ISID
	for _, c := range order {
		ps := byConn[c]
		first, ok := ps[0].Frame.Header.(*pdu.LoginRequest)
		if !ok {
			continue
		}
		keys := map[string]string{}
		refused, chap, mutual := false, false, false
		login := 0 // PDUs up to the last Login Response
		for i, p := range ps {
			switch h := p.Frame.Header.(type) {
			case *pdu.LoginRequest:
				for _, kv := range strings.Split(string(p.Frame.Data), "\x00") {
					k, v, _ := strings.Cut(kv, "=")
					keys[k] = v
				}
			case *pdu.LoginResponse:
				login = i + 1
				refused = refused || h.Status != pdu.LoginSuccess
			}
		}
		_, chap = keys["CHAP_N"]
		_, mutual = keys["CHAP_C"]
		auth := map[bool]string{false: "", true: "-chap"}[chap] + map[bool]string{false: "", true: "-mutual"}[mutual]
		loginAndLogout := func() []capPDU {
			sel := append([]capPDU(nil), ps[:login]...)
			for _, p := range ps[login:] {
				switch p.Frame.Header.(type) {
				case *pdu.LogoutRequest, *pdu.LogoutResponse:
					sel = append(sel, p)
				}
			}
			return sel
		}
		switch {
		case keys["SessionType"] == "Discovery" && refused:
			add("discovery"+auth+"-refused", "discovery session with a wrong CHAP secret: refused (0201)", ps)
		case keys["SessionType"] == "Discovery":
			add("discovery"+auth, "discovery session: SendTargets=All, the target listed", ps)
		case refused:
			add("login"+auth+"-refused", "normal session with a wrong CHAP secret: refused (0201)", ps)
		case keys["FirstBurstLength"] == "512":
			add("session"+auth+"-small-burst", "a whole normal session with FirstBurstLength, MaxBurstLength and MaxRecvDataSegmentLength 512: the SCSI scan, a 2 KiB write (immediate data, R2T, Data-Out), a 2 KiB read (Data-In), NOP-Out/NOP-In, a LUN RESET (sg_reset -d), SYNCHRONIZE CACHE, logout", ps)
		case first.ISID == lastISID && !taken["session-reinstated"]:
			add("session-reinstated", "the login of a session coming back on its own after the target was killed (kill -9) and restarted: the same ISID, TSIH 0", ps[:login])
		default:
			add("session"+auth+"-login", "login of a normal session with iscsid.conf's operational offer, then logout (the I/O between is left out)", loginAndLogout())
		}
		lastISID = first.ISID
	}
	return out
}

// writeGolden writes goldenConns into dir.
func writeGolden(dir, target, version string, pdus []capPDU) ([]string, error) {
	var names []string
	for _, g := range goldenConns(target, pdus) {
		var b strings.Builder
		fmt.Fprintf(&b, "# Captured %s from open-iscsi %s (Debian, kernel iscsi_tcp in the test guest) against %s\n",
			time.Now().UTC().Format("2006-01-02"), version, target)
		b.WriteString("# by tests/iscsiguest TestGuestLogin with VMSAN_ISCSI_GOLDEN (guest script tests/iscsiguest/testdata/login.sh)\n")
		b.WriteString("# Connection: " + g.about + ".\n")
		b.WriteString("# One PDU per line, no digests negotiated: C = initiator->target, S = target->initiator.\n")
		for _, p := range g.pdus {
			b.WriteString(p.Dir + " " + hex.EncodeToString(p.Raw) + "\n")
		}
		if err := os.WriteFile(filepath.Join(dir, g.name), []byte(b.String()), 0o644); err != nil {
			return names, err
		}
		names = append(names, g.name)
	}
	return names, nil
}
