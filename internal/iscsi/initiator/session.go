package initiator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// ErrSessionFailed is wrapped by the error of every command that was
// outstanding (or submitted later) when the session failed: connection
// lost, protocol violation by the target, NOP timeout, Close.
var ErrSessionFailed = errors.New("iscsi: session failed")

// Session is one logged-in iSCSI session over one TCP connection.
type Session struct {
	nc     net.Conn
	br     *bufio.Reader
	params text.Params
	tsih   uint16
	alias  string
	dig    pdu.Digests
	// maxSend bounds the data segments we send (the target's declared
	// MaxRecvDataSegmentLength); maxRecv bounds what we accept.
	maxSend, maxRecv int
	discovery        bool

	mu   sync.Mutex
	cond *sync.Cond // broadcast when the window opens or the session fails
	// INVARIANT (under mu): cmdSN is the CmdSN the next non-immediate
	// command gets; a command is sent only while cmdSN <= maxCmdSN, so the
	// initiator never overruns the target's window.
	cmdSN, expCmdSN, maxCmdSN uint32
	expStatSN                 uint32
	nextITT                   uint32
	tasks                     map[uint32]*task
	failed                    error // non-nil once the session is dead

	wmu    sync.Mutex
	wcond  *sync.Cond
	wq     net.Buffers // queued PDUs, in send order
	wclose bool
	wdone  chan struct{} // closed when writeLoop has returned

	lastRecv  atomic.Int64 // unix nanos of the last PDU from the target
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	// Stats.
	bytesIn, bytesOut atomic.Uint64 // SCSI data moved (Data-In / Data-Out + immediate)
}

// Response is a SCSI command's outcome.
type Response struct {
	Status   pdu.SCSIStatus
	Response pdu.ServiceResponse
	Sense    []byte // sense data of a CHECK CONDITION
	// Residual is the Residual Count: with Underflow, the bytes of the
	// expected transfer that did not move; with Overflow, the excess.
	Residual            uint32
	Underflow, Overflow bool
	// DataIn is the number of bytes the target moved into the read buffer.
	DataIn int
}

// task is one outstanding command (or NOP-Out / Text / Logout exchange).
type task struct {
	itt   uint32
	lun   uint64
	read  []byte // Data-In destination
	write []byte // Data-Out source
	resp  Response
	pdu   pdu.PDU // a non-SCSI response (NOPIn, TextResponse, LogoutResponse)
	data  []byte  // its data segment
	err   error
	done  chan struct{}
	scsi  bool
	// Data-In reassembly: the next expected DataSN and the bytes received.
	dataSN  uint32
	nextR2T uint32
}

// Dial connects to addr (host:port, port 3260 by default), logs in to
// cfg.TargetName and returns the session in full feature phase.
func Dial(ctx context.Context, addr string, cfg Config) (*Session, error) {
	return dial(ctx, addr, &cfg, false)
}

func dial(ctx context.Context, addr string, cfg *Config, discovery bool) (*Session, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, "3260")
	}
	to := cfg.DialTimeout
	if to == 0 {
		to = 15 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, to)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	return newSession(ctx, nc, cfg, discovery)
}

// NewSession logs in over an established connection (for tests: a
// net.Pipe to a fake target). It owns nc afterwards.
func NewSession(ctx context.Context, nc net.Conn, cfg Config) (*Session, error) {
	return newSession(ctx, nc, &cfg, false)
}

func newSession(ctx context.Context, nc net.Conn, cfg *Config, discovery bool) (*Session, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	// Closing the connection when ctx ends unblocks a login in progress.
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	br := bufio.NewReaderSize(nc, 64<<10)
	lr, err := login(nc, br, cfg, discovery)
	if !stop() {
		if err == nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	s := &Session{
		nc: nc, br: br, params: lr.params, tsih: lr.tsih, alias: lr.alias, discovery: discovery,
		dig:      pdu.Digests{Header: lr.params.HeaderDigest, Data: lr.params.DataDigest},
		maxSend:  int(lr.params.PeerMaxRecvDataSegmentLength),
		maxRecv:  int(lr.params.MaxRecvDataSegmentLength),
		cmdSN:    lr.cmdSN,
		expCmdSN: lr.expCmdSN, maxCmdSN: lr.maxCmdSN, expStatSN: lr.expStat,
		nextITT: 1,
		tasks:   make(map[uint32]*task),
		done:    make(chan struct{}),
		wdone:   make(chan struct{}),
	}
	// The first command carries the login's CmdSN, which the target's
	// ExpCmdSN names (the immediate login did not advance it); follow the
	// target if the two disagree, since it drops CmdSNs it does not expect.
	s.cmdSN = s.expCmdSN
	s.cond = sync.NewCond(&s.mu)
	s.wcond = sync.NewCond(&s.wmu)
	s.lastRecv.Store(time.Now().UnixNano())
	s.wg.Add(2)
	go s.readLoop()
	go s.writeLoop()
	if cfg.NOPInterval > 0 {
		s.wg.Add(1)
		go s.pinger(cfg.NOPInterval)
	}
	return s, nil
}

// Params returns the negotiated operational values.
func (s *Session) Params() text.Params { return s.params }

// TargetAlias is the TargetAlias the target declared, if any.
func (s *Session) TargetAlias() string { return s.alias }

// TSIH is the target-assigned session handle.
func (s *Session) TSIH() uint16 { return s.tsih }

// Stats are the SCSI payload bytes this session moved.
type Stats struct {
	DataIn, DataOut uint64
}

// Stats returns the payload bytes moved so far.
func (s *Session) Stats() Stats {
	return Stats{DataIn: s.bytesIn.Load(), DataOut: s.bytesOut.Load()}
}

// Err returns the error that failed the session, nil while it works.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// fail marks the session dead and closes the connection; the reader
// goroutine then exits and fails every outstanding task (finish). Safe to
// call more than once, from any goroutine.
//
// INVARIANT: only the reader goroutine completes tasks, and on failure
// only after the writer goroutine has exited, so that when a caller's
// Command returns, neither goroutine touches its buffer any more (the
// reader may be copying a Data-In payload into it, the writer may be
// sending it as Data-Out, until they notice the closed connection).
func (s *Session) fail(err error) {
	s.mu.Lock()
	if s.failed == nil {
		s.failed = fmt.Errorf("%w: %v", ErrSessionFailed, err)
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	s.closeOnce.Do(func() {
		close(s.done)
		s.nc.Close()
		s.wmu.Lock()
		s.wclose = true
		s.wq = nil
		s.wcond.Broadcast()
		s.wmu.Unlock()
	})
}

// finish fails every outstanding task; called by the reader goroutine
// once it and the writer have stopped.
func (s *Session) finish() {
	s.mu.Lock()
	tasks := s.tasks
	s.tasks = make(map[uint32]*task)
	ferr := s.failed
	s.mu.Unlock()
	for _, t := range tasks {
		t.err = ferr
		close(t.done)
	}
}

// Close drops the connection without logging out; outstanding commands
// fail with ErrSessionFailed.
func (s *Session) Close() error {
	s.fail(errors.New("closed"))
	s.wg.Wait()
	return nil
}

// enqueue appends complete PDUs to the send queue.
func (s *Session) enqueue(bufs ...[]byte) {
	s.wmu.Lock()
	if !s.wclose {
		s.wq = append(s.wq, bufs...)
		s.wcond.Signal()
	}
	s.wmu.Unlock()
}

// writeLoop sends queued PDUs, all that are queued in one writev.
func (s *Session) writeLoop() {
	defer s.wg.Done()
	defer close(s.wdone)
	for {
		s.wmu.Lock()
		for len(s.wq) == 0 && !s.wclose {
			s.wcond.Wait()
		}
		if s.wclose {
			s.wmu.Unlock()
			return
		}
		q := s.wq
		s.wq = nil
		s.wmu.Unlock()
		if _, err := q.WriteTo(s.nc); err != nil {
			s.fail(fmt.Errorf("writing to the target: %w", err))
			return
		}
	}
}

// header encodes h's BHS (framing fields set for dataLen bytes of data)
// plus its header digest.
func (s *Session) header(h pdu.PDU, dataLen int) ([]byte, error) {
	l := h.Framing()
	l.TotalAHSLength = 0
	l.DataSegmentLength = uint32(dataLen)
	n := pdu.BHSLen
	if s.dig.Header {
		n += pdu.DigestLen
	}
	b := make([]byte, n)
	if err := h.Encode(b); err != nil {
		return nil, err
	}
	if s.dig.Header {
		putDigest(b[pdu.BHSLen:], pdu.CRC32C(b[:pdu.BHSLen]))
	}
	return b, nil
}

var zeroPad [4]byte

// pduBufs returns the buffers of one PDU whose data segment is data
// (aliased, not copied).
func (s *Session) pduBufs(h pdu.PDU, data []byte) ([][]byte, error) {
	hdr, err := s.header(h, len(data))
	if err != nil {
		return nil, err
	}
	out := [][]byte{hdr}
	if len(data) > 0 {
		out = append(out, data)
		pad := pdu.Pad(len(data))
		if pad > 0 {
			out = append(out, zeroPad[:pad])
		}
		if s.dig.Data {
			c := crc32.Update(0, castagnoli, data)
			c = crc32.Update(c, castagnoli, zeroPad[:pad])
			d := make([]byte, 4)
			putDigest(d, c)
			out = append(out, d)
		}
	}
	return out, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func putDigest(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func getDigest(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// submit registers t, waits for a CmdSN window slot (unless immediate),
// and queues the PDUs build returns, all under mu so that CmdSNs go out in
// order. build gets the CmdSN and ExpStatSN to put in the PDU.
func (s *Session) submit(ctx context.Context, t *task, immediate bool, build func(cmdSN, expStatSN uint32) ([][]byte, error)) error {
	s.mu.Lock()
	if !immediate {
		var stop func() bool
		for s.failed == nil && !pdu.SNLessEq(s.cmdSN, s.maxCmdSN) {
			if stop == nil && ctx.Done() != nil {
				stop = context.AfterFunc(ctx, func() {
					s.mu.Lock()
					s.cond.Broadcast()
					s.mu.Unlock()
				})
			}
			if ctx.Err() != nil {
				break
			}
			s.cond.Wait()
		}
		if stop != nil {
			stop()
		}
		if s.failed == nil && ctx.Err() != nil {
			s.mu.Unlock()
			return ctx.Err()
		}
	}
	if s.failed != nil {
		err := s.failed
		s.mu.Unlock()
		return err
	}
	t.itt = s.nextITT
	s.nextITT++
	if s.nextITT == pdu.ReservedTag {
		s.nextITT = 1
	}
	if _, busy := s.tasks[t.itt]; busy {
		s.mu.Unlock()
		return fmt.Errorf("iscsi: 2^32 tasks outstanding")
	}
	bufs, err := build(s.cmdSN, s.expStatSN)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	if !immediate {
		s.cmdSN++
	}
	s.tasks[t.itt] = t
	s.enqueue(bufs...)
	s.mu.Unlock()
	return nil
}

// wait waits for t's completion.
func (t *task) wait() error {
	<-t.done
	return t.err
}

// Command runs one SCSI command on lun: cdb (at most 16 bytes), with
// dataOut sent to the target (a write) or dataIn filled by it (a read);
// at most one of them non-empty. It returns when the status arrives. A
// CHECK CONDITION is not an error here: see Response.Status and Sense
// (Check turns them into an error).
func (s *Session) Command(ctx context.Context, lun uint64, cdb []byte, dataOut, dataIn []byte) (Response, error) {
	if len(cdb) == 0 || len(cdb) > 16 {
		return Response{}, fmt.Errorf("iscsi: CDB of %d bytes (1..16 supported)", len(cdb))
	}
	if len(dataOut) > 0 && len(dataIn) > 0 {
		return Response{}, errors.New("iscsi: bidirectional commands are not supported")
	}
	if s.discovery {
		return Response{}, errors.New("iscsi: SCSI command on a discovery session")
	}
	t := &task{lun: lun, read: dataIn, write: dataOut, done: make(chan struct{}), scsi: true}
	p := &s.params
	err := s.submit(ctx, t, false, func(cmdSN, expStat uint32) ([][]byte, error) {
		cmd := &pdu.SCSICommand{Attr: pdu.AttrSimple, LUN: lun, ITT: t.itt, CmdSN: cmdSN, ExpStatSN: expStat}
		copy(cmd.CDB[:], cdb)
		var imm []byte
		unsolicited := 0
		if len(dataOut) > 0 {
			cmd.Write = true
			cmd.ExpectedDataTransferLength = uint32(len(dataOut))
			fb := int(p.FirstBurstLength)
			if p.ImmediateData {
				imm = dataOut[:min(len(dataOut), fb, s.maxSend)]
			}
			if !p.InitialR2T {
				unsolicited = min(len(dataOut), fb) - len(imm)
			}
		} else if len(dataIn) > 0 {
			cmd.Read = true
			cmd.ExpectedDataTransferLength = uint32(len(dataIn))
		}
		cmd.Final = unsolicited == 0
		bufs, err := s.pduBufs(cmd, imm)
		if err != nil {
			return nil, err
		}
		s.bytesOut.Add(uint64(len(imm)))
		if unsolicited > 0 {
			more, err := s.dataOut(t, pdu.ReservedTag, len(imm), unsolicited, expStat)
			if err != nil {
				return nil, err
			}
			bufs = append(bufs, more...)
		}
		return bufs, nil
	})
	if err != nil {
		return Response{}, err
	}
	if err := t.wait(); err != nil {
		return Response{}, err
	}
	return t.resp, nil
}

// dataOut builds the Data-Out PDUs for [off, off+n) of t's write buffer,
// each at most the target's MaxRecvDataSegmentLength, DataSN from 0, F on
// the last (one sequence: an R2T's, or the unsolicited burst).
func (s *Session) dataOut(t *task, ttt uint32, off, n int, expStat uint32) ([][]byte, error) {
	var bufs [][]byte
	for sn := uint32(0); n > 0; sn++ {
		l := min(n, s.maxSend)
		d := &pdu.DataOut{Final: l == n, LUN: t.lun, ITT: t.itt, TTT: ttt, ExpStatSN: expStat, DataSN: sn, BufferOffset: uint32(off)}
		b, err := s.pduBufs(d, t.write[off:off+l])
		if err != nil {
			return nil, err
		}
		bufs = append(bufs, b...)
		s.bytesOut.Add(uint64(l))
		off += l
		n -= l
	}
	return bufs, nil
}

// updateSNs applies the window of a target PDU (RFC 7143 4.2.2.1: ignore
// a MaxCmdSN less than ExpCmdSN-1, and never move backwards).
// REQUIRES: s.mu held.
func (s *Session) updateSNs(sn pdu.StatusSNs) {
	if pdu.SNLess(sn.MaxCmdSN, sn.ExpCmdSN-1) {
		return
	}
	if pdu.SNGreater(sn.ExpCmdSN, s.expCmdSN) {
		s.expCmdSN = sn.ExpCmdSN
	}
	if pdu.SNGreater(sn.MaxCmdSN, s.maxCmdSN) {
		s.maxCmdSN = sn.MaxCmdSN
		s.cond.Broadcast()
	}
}

// status records a StatSN carried with a status.
// REQUIRES: s.mu held.
func (s *Session) status(statSN uint32) {
	if pdu.SNGreater(statSN+1, s.expStatSN) {
		s.expStatSN = statSN + 1
	}
}

// readLoop reads the target's PDUs and dispatches them by ITT until the
// connection fails. Data-In payloads are read straight into the command's
// buffer after checking that they fit it.
func (s *Session) readLoop() {
	defer s.wg.Done()
	err := s.readPDUs()
	s.fail(err)
	<-s.wdone
	s.finish()
}

func (s *Session) readPDUs() error {
	hlen := pdu.BHSLen
	if s.dig.Header {
		hlen += pdu.DigestLen
	}
	hdr := make([]byte, hlen+pdu.MaxTotalAHSLength)
	// scratch holds data segments that are not Data-In payloads (sense,
	// text, NOP-In pings); bounded by maxRecv.
	scratch := make([]byte, 0, 8192)
	var tail [8]byte
	for {
		if _, err := io.ReadFull(s.br, hdr[:pdu.BHSLen]); err != nil {
			return fmt.Errorf("reading from the target: %w", err)
		}
		s.lastRecv.Store(time.Now().UnixNano())
		op, l, _ := pdu.PeekLengths(hdr)
		ahs := int(l.TotalAHSLength) * 4
		n := pdu.BHSLen + ahs
		if s.dig.Header {
			n += pdu.DigestLen
		}
		if _, err := io.ReadFull(s.br, hdr[pdu.BHSLen:n]); err != nil {
			return fmt.Errorf("reading from the target: %w", err)
		}
		if s.dig.Header {
			if got, want := getDigest(hdr[n-pdu.DigestLen:n]), pdu.CRC32C(hdr[:n-pdu.DigestLen]); got != want {
				return &pdu.DigestError{Header: true, Got: got, Want: want}
			}
		}
		dl := int(l.DataSegmentLength)
		// INVARIANT: nothing is allocated or read for a data segment longer
		// than the MaxRecvDataSegmentLength we declared.
		if dl > s.maxRecv {
			return fmt.Errorf("%s with a %d-byte data segment, over our MaxRecvDataSegmentLength %d", op, dl, s.maxRecv)
		}
		h, err := pdu.Decode(hdr[:pdu.BHSLen])
		if err != nil {
			return fmt.Errorf("target sent %w", err)
		}
		if op.FromInitiator() {
			return fmt.Errorf("target sent an initiator opcode (%s)", op)
		}
		pad := pdu.Pad(dl)
		tl := pad
		if dl > 0 && s.dig.Data {
			tl += pdu.DigestLen
		}
		// The destination of the data segment.
		var dst []byte
		var t *task
		if di, ok := h.(*pdu.DataIn); ok {
			s.mu.Lock()
			t = s.tasks[di.ITT]
			s.mu.Unlock()
			if t == nil || !t.scsi {
				return fmt.Errorf("Data-In for unknown ITT %#x", di.ITT)
			}
			off := int(di.BufferOffset)
			if off+dl > len(t.read) || off < 0 {
				return fmt.Errorf("Data-In [%d,+%d) beyond the %d-byte read buffer of ITT %#x", off, dl, len(t.read), di.ITT)
			}
			if di.DataSN != t.dataSN {
				return fmt.Errorf("Data-In DataSN %d, expected %d (ITT %#x)", di.DataSN, t.dataSN, di.ITT)
			}
			t.dataSN++
			dst = t.read[off : off+dl]
		} else {
			if cap(scratch) < dl {
				scratch = make([]byte, dl)
			}
			dst = scratch[:dl]
		}
		if dl > 0 {
			if _, err := io.ReadFull(s.br, dst); err != nil {
				return fmt.Errorf("reading from the target: %w", err)
			}
			if _, err := io.ReadFull(s.br, tail[:tl]); err != nil {
				return fmt.Errorf("reading from the target: %w", err)
			}
			if s.dig.Data {
				c := crc32.Update(0, castagnoli, dst)
				c = crc32.Update(c, castagnoli, tail[:pad])
				if got := getDigest(tail[pad:tl]); got != c {
					// At ErrorRecoveryLevel 0 a corrupt payload fails the
					// session (RFC 7143 7.8: the initiator may not ask for
					// a retransmission without ERL >= 1).
					return &pdu.DigestError{Got: got, Want: c}
				}
			}
		}
		if err := s.dispatch(h, t, dst); err != nil {
			return err
		}
	}
}

// dispatch handles one target PDU. t is the task of a Data-In (already
// looked up); data is the PDU's data segment (valid until the next read).
func (s *Session) dispatch(h pdu.PDU, t *task, data []byte) error {
	switch p := h.(type) {
	case *pdu.DataIn:
		s.bytesIn.Add(uint64(len(data)))
		t.resp.DataIn += len(data)
		s.mu.Lock()
		s.updateSNs(p.StatusSNs)
		if !p.HasStatus {
			s.mu.Unlock()
			return nil
		}
		s.status(p.StatSN)
		delete(s.tasks, p.ITT)
		s.mu.Unlock()
		t.resp.Status = p.Status
		t.resp.Residual = p.ResidualCount
		t.resp.Underflow, t.resp.Overflow = p.Underflow, p.Overflow
		close(t.done)
	case *pdu.SCSIResponse:
		s.mu.Lock()
		s.updateSNs(p.StatusSNs)
		s.status(p.StatSN)
		t = s.tasks[p.ITT]
		if t == nil || !t.scsi {
			s.mu.Unlock()
			return fmt.Errorf("SCSI Response for unknown ITT %#x", p.ITT)
		}
		// Parse before the task leaves the map: on an error the session
		// fails and finish completes the task.
		sense, err := pdu.ParseSenseData(data)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("SCSI Response sense: %w", err)
		}
		delete(s.tasks, p.ITT)
		s.mu.Unlock()
		t.resp.Status, t.resp.Response = p.Status, p.Response
		t.resp.Residual = p.ResidualCount
		t.resp.Underflow, t.resp.Overflow = p.Underflow, p.Overflow
		if len(sense) > 0 {
			t.resp.Sense = append([]byte(nil), sense...)
		}
		close(t.done)
	case *pdu.R2T:
		s.mu.Lock()
		s.updateSNs(p.StatusSNs)
		t = s.tasks[p.ITT]
		expStat := s.expStatSN
		s.mu.Unlock()
		if t == nil || !t.scsi || len(t.write) == 0 {
			return fmt.Errorf("R2T for unknown or non-write ITT %#x", p.ITT)
		}
		if p.R2TSN != t.nextR2T {
			return fmt.Errorf("R2TSN %d, expected %d (ITT %#x)", p.R2TSN, t.nextR2T, p.ITT)
		}
		t.nextR2T++
		off, n := int(p.BufferOffset), int(p.DesiredDataTransferLength)
		if n == 0 || off+n > len(t.write) || n > int(s.params.MaxBurstLength) {
			return fmt.Errorf("R2T for [%d,+%d) of a %d-byte write (MaxBurstLength %d)", off, n, len(t.write), s.params.MaxBurstLength)
		}
		bufs, err := s.dataOut(t, p.TTT, off, n, expStat)
		if err != nil {
			return err
		}
		s.enqueue(bufs...)
	case *pdu.NOPIn:
		s.mu.Lock()
		s.updateSNs(p.StatusSNs)
		if p.ITT != pdu.ReservedTag {
			// The answer to our ping: it carries a status (StatSN advances).
			s.status(p.StatSN)
			t = s.tasks[p.ITT]
			// INVARIANT: a task leaves the map only when it is completed
			// here; a PDU of the wrong kind for it leaves it for finish.
			if t != nil && !t.scsi {
				delete(s.tasks, p.ITT)
			}
		}
		cmdSN, expStat := s.cmdSN, s.expStatSN
		s.mu.Unlock()
		if p.ITT != pdu.ReservedTag {
			if t == nil || t.scsi {
				return fmt.Errorf("NOP-In for unknown ITT %#x", p.ITT)
			}
			t.pdu, t.data = p, append([]byte(nil), data...)
			close(t.done)
			return nil
		}
		if p.TTT != pdu.ReservedTag {
			// The target pings: answer with its TTT and its data (RFC 7143
			// 11.18), as an immediate NOP-Out with ITT 0xffffffff.
			out := &pdu.NOPOut{Immediate: true, LUN: p.LUN, ITT: pdu.ReservedTag, TTT: p.TTT, CmdSN: cmdSN, ExpStatSN: expStat}
			bufs, err := s.pduBufs(out, append([]byte(nil), data...))
			if err != nil {
				return err
			}
			s.enqueue(bufs...)
		}
	case *pdu.TextResponse, *pdu.LogoutResponse, *pdu.TaskMgmtResponse:
		var itt uint32
		var sns pdu.StatusSNs
		switch q := p.(type) {
		case *pdu.TextResponse:
			itt, sns = q.ITT, q.StatusSNs
		case *pdu.LogoutResponse:
			itt, sns = q.ITT, q.StatusSNs
		case *pdu.TaskMgmtResponse:
			itt, sns = q.ITT, q.StatusSNs
		}
		s.mu.Lock()
		s.updateSNs(sns)
		s.status(sns.StatSN)
		t = s.tasks[itt]
		if t != nil && !t.scsi {
			delete(s.tasks, itt)
		}
		s.mu.Unlock()
		if t == nil || t.scsi {
			return fmt.Errorf("%s for unknown ITT %#x", h.Opcode(), itt)
		}
		t.pdu, t.data = p, append([]byte(nil), data...)
		close(t.done)
	case *pdu.AsyncMessage:
		s.mu.Lock()
		s.updateSNs(p.StatusSNs)
		s.status(p.StatSN)
		s.mu.Unlock()
		switch p.AsyncEvent {
		case pdu.AsyncLogoutRequest:
			return errors.New("target requested logout (Async Message)")
		case pdu.AsyncConnectionDrop, pdu.AsyncSessionDrop:
			return fmt.Errorf("target dropped the session (Async Message event %d)", p.AsyncEvent)
		}
		// SCSI async events (unit attentions) and vendor events need no
		// action: the next command sees the unit attention.
	case *pdu.Reject:
		s.mu.Lock()
		s.updateSNs(p.StatusSNs)
		s.status(p.StatSN)
		s.mu.Unlock()
		itt := uint32(pdu.ReservedTag)
		if len(data) >= pdu.BHSLen {
			itt = uint32(data[16])<<24 | uint32(data[17])<<16 | uint32(data[18])<<8 | uint32(data[19])
		}
		// At ErrorRecoveryLevel 0 a rejected command cannot be retried in
		// place; the session is failed so no caller waits forever.
		return fmt.Errorf("target rejected a PDU (ITT %#x): %s", itt, p.Reason)
	default:
		return fmt.Errorf("unexpected %s in full feature phase", h.Opcode())
	}
	return nil
}

// exchange runs one non-SCSI request (NOP-Out, Text, Logout) and returns
// the target's answer.
func (s *Session) exchange(ctx context.Context, immediate bool, build func(itt, cmdSN, expStat uint32) (pdu.PDU, []byte)) (pdu.PDU, []byte, error) {
	t := &task{done: make(chan struct{})}
	err := s.submit(ctx, t, immediate, func(cmdSN, expStat uint32) ([][]byte, error) {
		h, data := build(t.itt, cmdSN, expStat)
		return s.pduBufs(h, data)
	})
	if err != nil {
		return nil, nil, err
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		// Nothing of the caller's is referenced by the task: it may be
		// left behind (its answer is then dropped).
		return nil, nil, ctx.Err()
	}
	if t.err != nil {
		return nil, nil, t.err
	}
	return t.pdu, t.data, nil
}

// Ping sends a NOP-Out and waits for the target's NOP-In.
func (s *Session) Ping(ctx context.Context) error {
	payload := []byte("vmsan ping")
	_, data, err := s.exchange(ctx, true, func(itt, cmdSN, expStat uint32) (pdu.PDU, []byte) {
		return &pdu.NOPOut{Immediate: true, LUN: 0, ITT: itt, TTT: pdu.ReservedTag, CmdSN: cmdSN, ExpStatSN: expStat}, payload
	})
	if err != nil {
		return err
	}
	if string(data) != string(payload) {
		return fmt.Errorf("iscsi: NOP-In echoed %q, sent %q", data, payload)
	}
	return nil
}

// pinger pings after interval of silence and fails the session when the
// ping gets no answer within another interval.
func (s *Session) pinger(interval time.Duration) {
	defer s.wg.Done()
	tk := time.NewTicker(interval / 2)
	defer tk.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tk.C:
		}
		if time.Since(time.Unix(0, s.lastRecv.Load())) < interval {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		err := s.Ping(ctx)
		cancel()
		if err != nil {
			s.fail(fmt.Errorf("no answer to NOP-Out within %v: %v", interval, err))
			return
		}
	}
}

// Logout logs the session out (reason: close the session) and closes the
// connection. Outstanding commands should have completed first; those
// still running fail.
func (s *Session) Logout(ctx context.Context) error {
	h, _, err := s.exchange(ctx, true, func(itt, cmdSN, expStat uint32) (pdu.PDU, []byte) {
		return &pdu.LogoutRequest{Immediate: true, Reason: pdu.LogoutCloseSession, ITT: itt, CmdSN: cmdSN, ExpStatSN: expStat}, nil
	})
	s.fail(errors.New("logged out"))
	s.wg.Wait()
	if err != nil {
		return err
	}
	if r := h.(*pdu.LogoutResponse); r.Response != pdu.LogoutClosedSuccessfully {
		return fmt.Errorf("iscsi: logout refused: %s", r.Response)
	}
	return nil
}
