package proto

import (
	"encoding/binary"
	"fmt"
)

var be = binary.BigEndian

// ---- Handshake -------------------------------------------------------------

// AppendServerGreeting appends the fixed-newstyle greeting: NBDMAGIC,
// IHAVEOPT and the 16-bit handshake flags.
func AppendServerGreeting(b []byte, flags uint16) []byte {
	b = be.AppendUint64(b, NBDMagic)
	b = be.AppendUint64(b, IHaveOpt)
	return be.AppendUint16(b, flags)
}

// ParseServerGreeting decodes a newstyle greeting (ServerGreetingSize bytes).
// An oldstyle server (cliserv magic) yields ErrBadMagic.
func ParseServerGreeting(b []byte) (flags uint16, err error) {
	if len(b) < ServerGreetingSize {
		return 0, ErrShort
	}
	if m := be.Uint64(b); m != NBDMagic {
		return 0, fmt.Errorf("%w: greeting %#x", ErrBadMagic, m)
	}
	if m := be.Uint64(b[8:]); m != IHaveOpt {
		return 0, fmt.Errorf("%w: greeting second magic %#x (oldstyle server?)", ErrBadMagic, m)
	}
	return be.Uint16(b[16:]), nil
}

// AppendClientFlags appends the 32-bit client flags.
func AppendClientFlags(b []byte, flags uint32) []byte { return be.AppendUint32(b, flags) }

// ParseClientFlags decodes the 32-bit client flags.
func ParseClientFlags(b []byte) (uint32, error) {
	if len(b) < ClientFlagsSize {
		return 0, ErrShort
	}
	return be.Uint32(b), nil
}

// ---- Options (client → server) ---------------------------------------------

// OptionHeader is the fixed part of a client option.
type OptionHeader struct {
	Opt    Opt
	Length uint32 // bytes of option data that follow
}

// ParseOptionHeader decodes OptionHeaderSize bytes. It checks the magic and
// that Length <= MaxOptionLength, so the caller can allocate Length bytes
// safely after a nil error. A too-long option is reported with ErrTooLong
// together with the decoded header (the server may then skip the data and
// reply NBD_REP_ERR_TOO_BIG, or disconnect).
func ParseOptionHeader(b []byte) (OptionHeader, error) {
	if len(b) < OptionHeaderSize {
		return OptionHeader{}, ErrShort
	}
	if m := be.Uint64(b); m != IHaveOpt {
		return OptionHeader{}, fmt.Errorf("%w: option magic %#x", ErrBadMagic, m)
	}
	h := OptionHeader{Opt: Opt(be.Uint32(b[8:])), Length: be.Uint32(b[12:])}
	if h.Length > MaxOptionLength {
		return h, fmt.Errorf("%w: %v data length %d > %d", ErrTooLong, h.Opt, h.Length, MaxOptionLength)
	}
	return h, nil
}

// AppendOption appends a complete client option (header and data).
func AppendOption(b []byte, opt Opt, data []byte) []byte {
	b = be.AppendUint64(b, IHaveOpt)
	b = be.AppendUint32(b, uint32(opt))
	b = be.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// Option is a decoded client option with its typed payload. Only the fields
// that apply to Opt are set.
type Option struct {
	Opt  Opt
	Data []byte // raw option data (aliases the input)

	// EXPORT_NAME, INFO, GO, LIST_META_CONTEXT, SET_META_CONTEXT.
	Name string
	// INFO, GO: the information types requested.
	InfoRequests []InfoType
	// LIST_META_CONTEXT, SET_META_CONTEXT: the queries.
	Queries []string
}

// ParseOption decodes one complete client option (header followed by at
// least Length bytes of data) and its typed payload for the options this
// package knows. It never allocates more than the input's size. For options
// whose data must be empty (ABORT, LIST, STARTTLS, STRUCTURED_REPLY) a
// non-empty payload yields ErrInvalid (the server answers
// NBD_REP_ERR_INVALID). Unknown options decode with just Opt and Data.
func ParseOption(b []byte) (Option, error) {
	h, err := ParseOptionHeader(b)
	if err != nil {
		return Option{Opt: h.Opt}, err
	}
	rest := b[OptionHeaderSize:]
	if uint64(len(rest)) < uint64(h.Length) {
		return Option{Opt: h.Opt}, ErrShort
	}
	return ParseOptionData(h.Opt, rest[:h.Length])
}

// ParseOptionData decodes the data of option opt (see ParseOption).
func ParseOptionData(opt Opt, data []byte) (Option, error) {
	o := Option{Opt: opt, Data: data}
	var err error
	switch opt {
	case OptExportName:
		if len(data) > MaxNameLength {
			return o, fmt.Errorf("%w: export name %d bytes", ErrTooLong, len(data))
		}
		o.Name = string(data)
	case OptAbort, OptList, OptStartTLS, OptStructuredReply, OptExtendedHeaders:
		if len(data) != 0 {
			return o, fmt.Errorf("%w: %v with %d bytes of data", ErrInvalid, opt, len(data))
		}
	case OptInfo, OptGo:
		o.Name, o.InfoRequests, err = parseInfoRequest(data)
	case OptListMetaContext, OptSetMetaContext:
		o.Name, o.Queries, err = parseMetaContextRequest(data)
	}
	return o, err
}

// readString reads a 32-bit length-prefixed string bounded by MaxNameLength.
func readString(b []byte) (s string, rest []byte, err error) {
	if len(b) < 4 {
		return "", nil, ErrShort
	}
	n := be.Uint32(b)
	if n > MaxNameLength {
		return "", nil, fmt.Errorf("%w: string length %d", ErrTooLong, n)
	}
	if uint64(len(b)-4) < uint64(n) {
		return "", nil, ErrShort
	}
	return string(b[4 : 4+n]), b[4+n:], nil
}

func parseInfoRequest(data []byte) (string, []InfoType, error) {
	name, rest, err := readString(data)
	if err != nil {
		return "", nil, err
	}
	if len(rest) < 2 {
		return name, nil, ErrShort
	}
	n := int(be.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*n {
		// Too few is a framing error; too many is also invalid per spec
		// (the option length must match exactly).
		return name, nil, fmt.Errorf("%w: %d info requests in %d bytes", ErrInvalid, n, len(rest))
	}
	var infos []InfoType
	if n > 0 {
		infos = make([]InfoType, n) // n*2 bytes are present, so n is bounded by the input
		for i := range infos {
			infos[i] = InfoType(be.Uint16(rest[2*i:]))
		}
	}
	return name, infos, nil
}

func parseMetaContextRequest(data []byte) (string, []string, error) {
	name, rest, err := readString(data)
	if err != nil {
		return "", nil, err
	}
	if len(rest) < 4 {
		return name, nil, ErrShort
	}
	n := be.Uint32(rest)
	rest = rest[4:]
	// Each query needs at least its 4-byte length, so this bounds n by the
	// input before allocating.
	if uint64(n)*4 > uint64(len(rest)) {
		return name, nil, fmt.Errorf("%w: %d queries in %d bytes", ErrShort, n, len(rest))
	}
	var qs []string
	if n > 0 {
		qs = make([]string, 0, n)
	}
	for i := uint32(0); i < n; i++ {
		var q string
		q, rest, err = readString(rest)
		if err != nil {
			return name, nil, err
		}
		qs = append(qs, q)
	}
	if len(rest) != 0 {
		return name, nil, fmt.Errorf("%w: %d trailing bytes", ErrInvalid, len(rest))
	}
	return name, qs, nil
}

// AppendInfoRequest appends NBD_OPT_INFO/NBD_OPT_GO data.
func AppendInfoRequest(b []byte, name string, infos []InfoType) []byte {
	b = be.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	b = be.AppendUint16(b, uint16(len(infos)))
	for _, t := range infos {
		b = be.AppendUint16(b, uint16(t))
	}
	return b
}

// AppendMetaContextRequest appends NBD_OPT_{LIST,SET}_META_CONTEXT data.
func AppendMetaContextRequest(b []byte, export string, queries []string) []byte {
	b = be.AppendUint32(b, uint32(len(export)))
	b = append(b, export...)
	b = be.AppendUint32(b, uint32(len(queries)))
	for _, q := range queries {
		b = be.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// ---- Option replies (server → client) -------------------------------------

// OptionReplyHeader is the fixed part of an option reply.
type OptionReplyHeader struct {
	Opt    Opt
	Type   Rep
	Length uint32
}

// AppendOptionReply appends an option reply with its data.
func AppendOptionReply(b []byte, opt Opt, rep Rep, data []byte) []byte {
	b = AppendOptionReplyHeader(b, OptionReplyHeader{Opt: opt, Type: rep, Length: uint32(len(data))})
	return append(b, data...)
}

// AppendOptionReplyHeader appends just the 20-byte header.
func AppendOptionReplyHeader(b []byte, h OptionReplyHeader) []byte {
	b = be.AppendUint64(b, OptReplyMagic)
	b = be.AppendUint32(b, uint32(h.Opt))
	b = be.AppendUint32(b, uint32(h.Type))
	return be.AppendUint32(b, h.Length)
}

// ParseOptionReplyHeader decodes OptionReplyHdrSize bytes. The caller must
// bound Length itself (replies to LIST can legitimately be many).
func ParseOptionReplyHeader(b []byte) (OptionReplyHeader, error) {
	if len(b) < OptionReplyHdrSize {
		return OptionReplyHeader{}, ErrShort
	}
	if m := be.Uint64(b); m != OptReplyMagic {
		return OptionReplyHeader{}, fmt.Errorf("%w: option reply magic %#x", ErrBadMagic, m)
	}
	return OptionReplyHeader{Opt: Opt(be.Uint32(b[8:])), Type: Rep(be.Uint32(b[12:])), Length: be.Uint32(b[16:])}, nil
}

// AppendRepServer appends NBD_REP_SERVER data: a 32-bit name length, the
// name, then an optional description filling the rest.
func AppendRepServer(b []byte, name, description string) []byte {
	b = be.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	return append(b, description...)
}

// ParseRepServer decodes NBD_REP_SERVER data.
func ParseRepServer(data []byte) (name, description string, err error) {
	if len(data) < 4 {
		return "", "", ErrShort
	}
	n := be.Uint32(data)
	if uint64(n) > uint64(len(data)-4) {
		return "", "", ErrShort
	}
	return string(data[4 : 4+n]), string(data[4+n:]), nil
}

// ExportInfo is the content of NBD_INFO_EXPORT (and of the EXPORT_NAME reply).
type ExportInfo struct {
	Size  uint64
	Flags uint16 // transmission flags
}

// BlockSize is the content of NBD_INFO_BLOCK_SIZE.
type BlockSize struct {
	Min, Preferred, Max uint32
}

// AppendInfoExport appends NBD_REP_INFO data for NBD_INFO_EXPORT.
func AppendInfoExport(b []byte, e ExportInfo) []byte {
	b = be.AppendUint16(b, uint16(InfoExport))
	b = be.AppendUint64(b, e.Size)
	return be.AppendUint16(b, e.Flags)
}

// AppendInfoString appends NBD_REP_INFO data for NBD_INFO_NAME or
// NBD_INFO_DESCRIPTION.
func AppendInfoString(b []byte, t InfoType, s string) []byte {
	b = be.AppendUint16(b, uint16(t))
	return append(b, s...)
}

// AppendInfoBlockSize appends NBD_REP_INFO data for NBD_INFO_BLOCK_SIZE.
func AppendInfoBlockSize(b []byte, bs BlockSize) []byte {
	b = be.AppendUint16(b, uint16(InfoBlockSize))
	b = be.AppendUint32(b, bs.Min)
	b = be.AppendUint32(b, bs.Preferred)
	return be.AppendUint32(b, bs.Max)
}

// Info is a decoded NBD_REP_INFO payload; the fields for Type are set.
type Info struct {
	Type      InfoType
	Export    ExportInfo // InfoExport
	Text      string     // InfoName, InfoDescription
	BlockSize BlockSize  // InfoBlockSize
}

// ParseInfo decodes NBD_REP_INFO data. Unknown types decode with only Type
// set (clients must ignore them).
func ParseInfo(data []byte) (Info, error) {
	if len(data) < 2 {
		return Info{}, ErrShort
	}
	in := Info{Type: InfoType(be.Uint16(data))}
	p := data[2:]
	switch in.Type {
	case InfoExport:
		if len(p) != 10 {
			return in, fmt.Errorf("%w: NBD_INFO_EXPORT length %d", ErrInvalid, len(data))
		}
		in.Export = ExportInfo{Size: be.Uint64(p), Flags: be.Uint16(p[8:])}
	case InfoName, InfoDescription:
		if len(p) > MaxNameLength {
			return in, fmt.Errorf("%w: %v %d bytes", ErrTooLong, in.Type, len(p))
		}
		in.Text = string(p)
	case InfoBlockSize:
		if len(p) != 12 {
			return in, fmt.Errorf("%w: NBD_INFO_BLOCK_SIZE length %d", ErrInvalid, len(data))
		}
		in.BlockSize = BlockSize{Min: be.Uint32(p), Preferred: be.Uint32(p[4:]), Max: be.Uint32(p[8:])}
	}
	return in, nil
}

// AppendRepMetaContext appends NBD_REP_META_CONTEXT data.
func AppendRepMetaContext(b []byte, id uint32, name string) []byte {
	b = be.AppendUint32(b, id)
	return append(b, name...)
}

// ParseRepMetaContext decodes NBD_REP_META_CONTEXT data.
func ParseRepMetaContext(data []byte) (id uint32, name string, err error) {
	if len(data) < 4 {
		return 0, "", ErrShort
	}
	if len(data)-4 > MaxNameLength {
		return 0, "", ErrTooLong
	}
	return be.Uint32(data), string(data[4:]), nil
}

// AppendExportNameReply appends the server's answer to NBD_OPT_EXPORT_NAME:
// size, transmission flags and, unless noZeroes, 124 zero bytes.
func AppendExportNameReply(b []byte, e ExportInfo, noZeroes bool) []byte {
	b = be.AppendUint64(b, e.Size)
	b = be.AppendUint16(b, e.Flags)
	if !noZeroes {
		b = append(b, make([]byte, ExportNameZeroesSize)...)
	}
	return b
}

// ParseExportNameReply decodes the 10-byte start of the EXPORT_NAME reply.
func ParseExportNameReply(b []byte) (ExportInfo, error) {
	if len(b) < 10 {
		return ExportInfo{}, ErrShort
	}
	return ExportInfo{Size: be.Uint64(b), Flags: be.Uint16(b[8:])}, nil
}

// ---- Transmission ----------------------------------------------------------

// Request is a transmission-phase request header (the WRITE payload follows
// it on the wire and is not part of this struct).
type Request struct {
	Flags  CmdFlag
	Type   Cmd
	Cookie uint64 // called "handle" in older spec versions
	Offset uint64
	Length uint32
}

// AppendRequest appends the 28-byte request header.
func AppendRequest(b []byte, r Request) []byte {
	b = be.AppendUint32(b, RequestMagic)
	b = be.AppendUint16(b, uint16(r.Flags))
	b = be.AppendUint16(b, uint16(r.Type))
	b = be.AppendUint64(b, r.Cookie)
	b = be.AppendUint64(b, r.Offset)
	return be.AppendUint32(b, r.Length)
}

// ParseRequest decodes a 28-byte request header. A wrong magic (including
// the extended-header magic, which this package does not negotiate) is
// ErrBadMagic: the stream cannot be resynchronised and the connection
// should be closed. Semantic checks (known command, flags, bounds) are the
// server's job.
func ParseRequest(b []byte) (Request, error) {
	if len(b) < RequestSize {
		return Request{}, ErrShort
	}
	if m := be.Uint32(b); m != RequestMagic {
		return Request{}, fmt.Errorf("%w: request magic %#x", ErrBadMagic, m)
	}
	return Request{
		Flags:  CmdFlag(be.Uint16(b[4:])),
		Type:   Cmd(be.Uint16(b[6:])),
		Cookie: be.Uint64(b[8:]),
		Offset: be.Uint64(b[16:]),
		Length: be.Uint32(b[24:]),
	}, nil
}

// SimpleReply is a simple reply header (READ data follows it on success).
type SimpleReply struct {
	Error  Errno
	Cookie uint64
}

// AppendSimpleReply appends the 16-byte simple reply header.
func AppendSimpleReply(b []byte, r SimpleReply) []byte {
	b = be.AppendUint32(b, SimpleReplyMagic)
	b = be.AppendUint32(b, uint32(r.Error))
	return be.AppendUint64(b, r.Cookie)
}

// ParseSimpleReply decodes a 16-byte simple reply header.
func ParseSimpleReply(b []byte) (SimpleReply, error) {
	if len(b) < SimpleReplySize {
		return SimpleReply{}, ErrShort
	}
	if m := be.Uint32(b); m != SimpleReplyMagic {
		return SimpleReply{}, fmt.Errorf("%w: simple reply magic %#x", ErrBadMagic, m)
	}
	return SimpleReply{Error: Errno(be.Uint32(b[4:])), Cookie: be.Uint64(b[8:])}, nil
}

// ReplyMagic returns the magic at the start of a reply, to tell simple
// replies from structured chunks.
func ReplyMagic(b []byte) (uint32, error) {
	if len(b) < 4 {
		return 0, ErrShort
	}
	return be.Uint32(b), nil
}

// ChunkHeader is a structured reply chunk header.
type ChunkHeader struct {
	Flags  uint16 // ReplyFlagDone
	Type   ReplyType
	Cookie uint64
	Length uint32 // payload bytes that follow
}

// AppendChunkHeader appends the 20-byte structured reply chunk header.
func AppendChunkHeader(b []byte, h ChunkHeader) []byte {
	b = be.AppendUint32(b, StructuredReplyMagic)
	b = be.AppendUint16(b, h.Flags)
	b = be.AppendUint16(b, uint16(h.Type))
	b = be.AppendUint64(b, h.Cookie)
	return be.AppendUint32(b, h.Length)
}

// ParseChunkHeader decodes a 20-byte chunk header. The caller must bound
// Length before reading the payload.
func ParseChunkHeader(b []byte) (ChunkHeader, error) {
	if len(b) < ChunkHeaderSize {
		return ChunkHeader{}, ErrShort
	}
	if m := be.Uint32(b); m != StructuredReplyMagic {
		return ChunkHeader{}, fmt.Errorf("%w: structured reply magic %#x", ErrBadMagic, m)
	}
	return ChunkHeader{Flags: be.Uint16(b[4:]), Type: ReplyType(be.Uint16(b[6:])), Cookie: be.Uint64(b[8:]), Length: be.Uint32(b[16:])}, nil
}

// AppendOffsetDataHeader appends a complete OFFSET_DATA chunk header plus the
// 8-byte offset; dataLen bytes of data must follow on the wire.
func AppendOffsetDataHeader(b []byte, flags uint16, cookie, offset uint64, dataLen uint32) []byte {
	b = AppendChunkHeader(b, ChunkHeader{Flags: flags, Type: ReplyTypeOffsetData, Cookie: cookie, Length: 8 + dataLen})
	return be.AppendUint64(b, offset)
}

// AppendOffsetHole appends a complete OFFSET_HOLE chunk.
func AppendOffsetHole(b []byte, flags uint16, cookie, offset uint64, size uint32) []byte {
	b = AppendChunkHeader(b, ChunkHeader{Flags: flags, Type: ReplyTypeOffsetHole, Cookie: cookie, Length: 12})
	b = be.AppendUint64(b, offset)
	return be.AppendUint32(b, size)
}

// ParseOffsetHole decodes an OFFSET_HOLE payload.
func ParseOffsetHole(p []byte) (offset uint64, size uint32, err error) {
	if len(p) != 12 {
		return 0, 0, fmt.Errorf("%w: OFFSET_HOLE length %d", ErrInvalid, len(p))
	}
	offset, size = be.Uint64(p), be.Uint32(p[8:])
	if size == 0 {
		return 0, 0, fmt.Errorf("%w: zero-length hole", ErrInvalid)
	}
	return offset, size, nil
}

// ParseOffsetDataPrefix splits an OFFSET_DATA payload into offset and data.
func ParseOffsetDataPrefix(p []byte) (offset uint64, data []byte, err error) {
	if len(p) < 9 {
		return 0, nil, fmt.Errorf("%w: OFFSET_DATA length %d", ErrInvalid, len(p))
	}
	return be.Uint64(p), p[8:], nil
}

// AppendNoneChunk appends the final NBD_REPLY_TYPE_NONE chunk.
func AppendNoneChunk(b []byte, cookie uint64) []byte {
	return AppendChunkHeader(b, ChunkHeader{Flags: ReplyFlagDone, Type: ReplyTypeNone, Cookie: cookie})
}

// AppendErrorChunk appends a complete NBD_REPLY_TYPE_ERROR chunk. msg is
// truncated to MaxNameLength bytes.
func AppendErrorChunk(b []byte, flags uint16, cookie uint64, errno Errno, msg string) []byte {
	if len(msg) > MaxNameLength {
		msg = msg[:MaxNameLength]
	}
	b = AppendChunkHeader(b, ChunkHeader{Flags: flags, Type: ReplyTypeError, Cookie: cookie, Length: uint32(6 + len(msg))})
	b = be.AppendUint32(b, uint32(errno))
	b = be.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// ChunkError is a decoded NBD_REPLY_TYPE_ERROR / ERROR_OFFSET payload.
type ChunkError struct {
	Errno     Errno
	Message   string
	Offset    uint64
	HasOffset bool
}

// ParseErrorChunk decodes the payload of an error chunk of type t.
func ParseErrorChunk(t ReplyType, p []byte) (ChunkError, error) {
	if len(p) < 6 {
		return ChunkError{}, ErrShort
	}
	ce := ChunkError{Errno: Errno(be.Uint32(p))}
	n := int(be.Uint16(p[4:]))
	rest := p[6:]
	if n > len(rest) {
		return ce, fmt.Errorf("%w: error message %d bytes in %d", ErrShort, n, len(rest))
	}
	ce.Message = string(rest[:n])
	rest = rest[n:]
	switch t {
	case ReplyTypeErrorOffset:
		if len(rest) != 8 {
			return ce, fmt.Errorf("%w: ERROR_OFFSET tail %d bytes", ErrInvalid, len(rest))
		}
		ce.Offset, ce.HasOffset = be.Uint64(rest), true
	default:
		if len(rest) != 0 {
			return ce, fmt.Errorf("%w: error chunk tail %d bytes", ErrInvalid, len(rest))
		}
	}
	if ce.Errno == 0 {
		return ce, fmt.Errorf("%w: error chunk with zero errno", ErrInvalid)
	}
	return ce, nil
}

// BlockDescriptor is one extent in a BLOCK_STATUS chunk.
type BlockDescriptor struct {
	Length uint32
	Flags  uint32 // StateHole | StateZero for base:allocation
}

// AppendBlockStatus appends a complete BLOCK_STATUS chunk.
func AppendBlockStatus(b []byte, flags uint16, cookie uint64, contextID uint32, ds []BlockDescriptor) []byte {
	b = AppendChunkHeader(b, ChunkHeader{Flags: flags, Type: ReplyTypeBlockStatus, Cookie: cookie, Length: uint32(4 + 8*len(ds))})
	b = be.AppendUint32(b, contextID)
	for _, d := range ds {
		b = be.AppendUint32(b, d.Length)
		b = be.AppendUint32(b, d.Flags)
	}
	return b
}

// ParseBlockStatus decodes a BLOCK_STATUS payload, appending descriptors to
// ds (pass a reused slice to avoid allocation).
func ParseBlockStatus(p []byte, ds []BlockDescriptor) (contextID uint32, out []BlockDescriptor, err error) {
	if len(p) < 12 || (len(p)-4)%8 != 0 {
		return 0, ds, fmt.Errorf("%w: BLOCK_STATUS length %d", ErrInvalid, len(p))
	}
	contextID = be.Uint32(p)
	for q := p[4:]; len(q) > 0; q = q[8:] {
		ds = append(ds, BlockDescriptor{Length: be.Uint32(q), Flags: be.Uint32(q[4:])})
	}
	return contextID, ds, nil
}
