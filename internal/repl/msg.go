package repl

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// MsgType identifies a replication message.
type MsgType uint8

const (
	MsgHello       MsgType = iota + 1 // data channel: Hello in Data
	MsgBitmap                         // data channel: run list in Data; Flags&FlagLast on the final part
	MsgData                           // data channel: replicated client op (Seq, Op, Offset, Length, Data)
	MsgRecvAck                        // control: protocol B ack of Seq
	MsgWriteAck                       // control: protocol C ack of Seq (Err set on failure)
	MsgPing                           // control
	MsgPingAck                        // control
	MsgRSData                         // data: resync payload at Offset
	MsgRSZero                         // data: resync range [Offset, Offset+Length) reads as zero
	MsgRSAck                          // control: resync range applied
	MsgRSHash                         // data: checksum of [Offset, +Length) in Data (csum resync)
	MsgRSHashReply                    // control: Flags&FlagMatch if equal, else the source sends data
	MsgSyncDone                       // data: resync finished; Seq = source's Current generation
	MsgVerifyReq                      // data: online verify hash of a range
	MsgVerifyReply                    // control: Flags&FlagMatch or not
	MsgVerifyDone                     // data: end of online verify
	MsgRole                           // control: sender's role changed (Op = Role)
	MsgSyncStart                      // data: resync begins; Seq = source's Bitmap gen (0: keep), Length = bytes to resync
	msgMax
)

var msgNames = [...]string{"", "Hello", "Bitmap", "Data", "RecvAck", "WriteAck", "Ping", "PingAck",
	"RSData", "RSZero", "RSAck", "RSHash", "RSHashReply", "SyncDone", "VerifyReq", "VerifyReply", "VerifyDone", "Role", "SyncStart"}

func (t MsgType) String() string {
	if t > 0 && t < msgMax {
		return msgNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", t)
}

// Control reports whether t travels on the control connection. Acks and
// pings never queue behind bulk data, so a busy secondary still answers
// pings (spurious disconnects under load).
func (t MsgType) Control() bool {
	switch t {
	case MsgRecvAck, MsgWriteAck, MsgPing, MsgPingAck, MsgRSAck, MsgRSHashReply, MsgVerifyReply, MsgRole:
		return true
	}
	return false
}

// Op of a replicated request (MsgData).
type Op uint8

const (
	OpWrite Op = iota + 1
	OpTrim
	OpZero
	OpFlush
)

func (o Op) String() string {
	switch o {
	case OpWrite:
		return "write"
	case OpTrim:
		return "trim"
	case OpZero:
		return "zero"
	case OpFlush:
		return "flush"
	}
	return fmt.Sprintf("Op(%d)", o)
}

// Message flags.
const (
	FlagFUA    = 1 << 0 // MsgData: durable before ack
	FlagNoHole = 1 << 1 // MsgData OpZero: keep allocated
	FlagLast   = 1 << 2 // MsgBitmap: final part
	FlagMatch  = 1 << 3 // MsgRSHashReply/MsgVerifyReply: hashes equal
	FlagErr    = 1 << 4 // MsgWriteAck/MsgRSAck: the peer failed to apply
)

// Message is one replication message. Data is borrowed: Decode returns a
// slice of its input, and AppendEncode copies it.
type Message struct {
	Type   MsgType
	Flags  uint8
	Op     Op
	Seq    uint64
	Offset int64
	Length int64
	Data   []byte
}

// Wire format (big endian), one frame per message:
//
//	magic   u32  "VMRP"
//	type    u8
//	flags   u8
//	op      u8
//	pad     u8
//	seq     u64
//	offset  u64
//	length  u64
//	datalen u32
//	data    [datalen]byte
const (
	wireMagic  = 0x564d5250
	HeaderSize = 40
	// MaxData bounds a frame's payload: the largest NBD request (32 MiB)
	// plus nothing else; bitmaps are sent in parts smaller than this.
	MaxData = 32 << 20
	// MaxOffset bounds offsets and lengths (2^62) so sums never overflow.
	MaxOffset = 1 << 62
	// HashSize is the size of resync/verify hashes (SHA-256).
	HashSize = 32
)

// Errors returned by Decode.
var (
	ErrShort    = errors.New("repl: short frame")
	ErrBadFrame = errors.New("repl: malformed frame")
)

// AppendEncode appends m's frame to dst.
func AppendEncode(dst []byte, m *Message) []byte {
	return append(AppendHeader(dst, m), m.Data...)
}

// AppendHeader appends only m's frame header (announcing len(m.Data)
// payload bytes), so a writer can send a large payload without copying it.
func AppendHeader(dst []byte, m *Message) []byte {
	var h [HeaderSize]byte
	binary.BigEndian.PutUint32(h[0:], wireMagic)
	h[4] = byte(m.Type)
	h[5] = m.Flags
	h[6] = byte(m.Op)
	binary.BigEndian.PutUint64(h[8:], m.Seq)
	binary.BigEndian.PutUint64(h[16:], uint64(m.Offset))
	binary.BigEndian.PutUint64(h[24:], uint64(m.Length))
	binary.BigEndian.PutUint32(h[32:], uint32(len(m.Data)))
	// h[36:40] reserved, zero.
	return append(dst, h[:]...)
}

// DecodeHeader parses a header and returns the payload length to read next.
// It validates everything that can be validated without the payload, so a
// reader can bound its allocation before reading.
func DecodeHeader(h []byte, m *Message) (int, error) {
	if len(h) < HeaderSize {
		return 0, ErrShort
	}
	if binary.BigEndian.Uint32(h[0:]) != wireMagic {
		return 0, fmt.Errorf("%w: bad magic", ErrBadFrame)
	}
	*m = Message{
		Type:   MsgType(h[4]),
		Flags:  h[5],
		Op:     Op(h[6]),
		Seq:    binary.BigEndian.Uint64(h[8:]),
		Offset: int64(binary.BigEndian.Uint64(h[16:])),
		Length: int64(binary.BigEndian.Uint64(h[24:])),
	}
	dlen := binary.BigEndian.Uint32(h[32:])
	if h[7] != 0 || binary.BigEndian.Uint32(h[36:]) != 0 {
		// Reserved bytes must be zero so they can carry meaning later.
		return 0, fmt.Errorf("%w: reserved bytes set", ErrBadFrame)
	}
	if m.Type == 0 || m.Type >= msgMax {
		return 0, fmt.Errorf("%w: unknown type %d", ErrBadFrame, h[4])
	}
	if dlen > MaxData {
		return 0, fmt.Errorf("%w: payload %d > %d", ErrBadFrame, dlen, MaxData)
	}
	if m.Offset < 0 || m.Offset > MaxOffset || m.Length < 0 || m.Length > MaxOffset {
		return 0, fmt.Errorf("%w: offset/length out of range", ErrBadFrame)
	}
	switch m.Type {
	case MsgData:
		if m.Op < OpWrite || m.Op > OpFlush {
			return 0, fmt.Errorf("%w: bad op %d", ErrBadFrame, m.Op)
		}
		if (m.Op == OpWrite) != (dlen > 0) || (m.Op == OpWrite && int64(dlen) != m.Length) {
			return 0, fmt.Errorf("%w: data length %d for %v of %d", ErrBadFrame, dlen, m.Op, m.Length)
		}
	case MsgRSData:
		if int64(dlen) != m.Length || dlen == 0 {
			return 0, fmt.Errorf("%w: resync data length mismatch", ErrBadFrame)
		}
	case MsgRSHash, MsgVerifyReq:
		if dlen != HashSize {
			return 0, fmt.Errorf("%w: hash length %d", ErrBadFrame, dlen)
		}
	case MsgHello:
		if dlen != helloSize {
			return 0, fmt.Errorf("%w: hello length %d", ErrBadFrame, dlen)
		}
	case MsgBitmap:
		// variable
	default:
		if dlen != 0 {
			return 0, fmt.Errorf("%w: %v carries no payload", ErrBadFrame, m.Type)
		}
	}
	return int(dlen), nil
}

// Decode parses one frame from b. It returns the message (Data aliases b)
// and the number of bytes consumed; ErrShort means b holds no whole frame.
func Decode(b []byte) (Message, int, error) {
	var m Message
	n, err := DecodeHeader(b, &m)
	if err != nil {
		return m, 0, err
	}
	if len(b) < HeaderSize+n {
		return m, 0, ErrShort
	}
	if n > 0 {
		m.Data = b[HeaderSize : HeaderSize+n : HeaderSize+n]
	}
	return m, HeaderSize + n, nil
}

const helloSize = 8 + 8*4 + 1 + 1 + 1 + 1 + 8 + 8 + 8

// EncodeHello serialises h for a MsgHello payload.
func EncodeHello(h Hello) []byte {
	b := make([]byte, helloSize)
	be := binary.BigEndian
	be.PutUint64(b[0:], h.NodeID)
	be.PutUint64(b[8:], h.Gens.Current)
	be.PutUint64(b[16:], h.Gens.Bitmap)
	be.PutUint64(b[24:], h.Gens.History[0])
	be.PutUint64(b[32:], h.Gens.History[1])
	b[40] = byte(h.Role)
	b[41] = byte(h.Disk)
	b[42] = byte(h.Protocol)
	// Byte 43 holds flags: bit 0 CrashedPrimary, bit 1 DiscardMyData.
	if h.CrashedPrimary {
		b[43] |= 1
	}
	if h.DiscardMyData {
		b[43] |= 2
	}
	be.PutUint64(b[44:], uint64(h.PromotedAt))
	be.PutUint64(b[52:], uint64(h.Size))
	be.PutUint64(b[60:], uint64(h.Dirty))
	return b
}

// DecodeHello parses a MsgHello payload.
func DecodeHello(b []byte) (Hello, error) {
	if len(b) != helloSize {
		return Hello{}, fmt.Errorf("%w: hello length %d", ErrBadFrame, len(b))
	}
	be := binary.BigEndian
	h := Hello{
		NodeID:         be.Uint64(b[0:]),
		Gens:           Generations{Current: be.Uint64(b[8:]), Bitmap: be.Uint64(b[16:]), History: [2]uint64{be.Uint64(b[24:]), be.Uint64(b[32:])}},
		Role:           Role(b[40]),
		Disk:           DiskState(b[41]),
		Protocol:       Protocol(b[42]),
		CrashedPrimary: b[43]&1 != 0,
		DiscardMyData:  b[43]&2 != 0,
		PromotedAt:     int64(be.Uint64(b[44:])),
		Size:           int64(be.Uint64(b[52:])),
		Dirty:          int64(be.Uint64(b[60:])),
	}
	if h.Role > Primary || h.Disk > UpToDate || h.Protocol > ProtoB || b[43] > 3 || h.Size < 0 || h.Size > MaxOffset || h.Dirty < 0 {
		return Hello{}, fmt.Errorf("%w: hello field out of range", ErrBadFrame)
	}
	return h, nil
}

// EncodeRuns serialises chunk runs as uvarint (gap, length) pairs.
func EncodeRuns(runs []Run) []byte {
	var b []byte
	prev := int64(0)
	for _, r := range runs {
		b = binary.AppendUvarint(b, uint64(r.Start-prev))
		b = binary.AppendUvarint(b, uint64(r.End-r.Start))
		prev = r.End
	}
	return b
}

// DecodeRuns parses EncodeRuns output, rejecting runs beyond chunks.
func DecodeRuns(b []byte, chunks int64) ([]Run, error) {
	var out []Run
	err := ForEachRun(b, chunks, func(r Run) { out = append(out, r) })
	return out, err
}

// ForEachRun parses EncodeRuns output calling fn per run, without
// allocating (a 32 MiB frame could otherwise expand to 16M Run values).
// Runs must be ascending and inside [0, chunks).
func ForEachRun(b []byte, chunks int64, fn func(Run)) error {
	prev := int64(0)
	for len(b) > 0 {
		gap, n := binary.Uvarint(b)
		if n <= 0 {
			return fmt.Errorf("%w: bad run gap", ErrBadFrame)
		}
		b = b[n:]
		l, n := binary.Uvarint(b)
		if n <= 0 {
			return fmt.Errorf("%w: bad run length", ErrBadFrame)
		}
		b = b[n:]
		if gap > uint64(chunks) || l == 0 || l > uint64(chunks) || uint64(prev)+gap+l > uint64(chunks) {
			return fmt.Errorf("%w: run outside the volume", ErrBadFrame)
		}
		start := prev + int64(gap)
		fn(Run{start, start + int64(l)})
		prev = start + int64(l)
	}
	return nil
}
