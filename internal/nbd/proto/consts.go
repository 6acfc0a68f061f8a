package proto

import "strconv"

// Magic numbers (nbd-proto.md "Handshake", "Transmission", "Reserved Magic values").
const (
	NBDMagic             uint64 = 0x4e42444d41474943 // "NBDMAGIC"
	IHaveOpt             uint64 = 0x49484156454F5054 // "IHAVEOPT": newstyle server greeting and every client option
	CliservMagic         uint64 = 0x00420281861253   // oldstyle negotiation only
	OptReplyMagic        uint64 = 0x3e889045565a9    // every option reply
	RequestMagic         uint32 = 0x25609513         // NBD_REQUEST_MAGIC
	SimpleReplyMagic     uint32 = 0x67446698         // NBD_SIMPLE_REPLY_MAGIC
	StructuredReplyMagic uint32 = 0x668e33ef         // NBD_STRUCTURED_REPLY_MAGIC
	ExtendedRequestMagic uint32 = 0x21e41c71         // NBD_EXTENDED_REQUEST_MAGIC (extension, not implemented)
	ExtendedReplyMagic   uint32 = 0x6e8a278c         // NBD_EXTENDED_REPLY_MAGIC (extension, not implemented)
)

// Fixed sizes of wire structures, in bytes.
const (
	ServerGreetingSize   = 18 // NBDMAGIC + IHAVEOPT + 16-bit handshake flags
	ClientFlagsSize      = 4
	OptionHeaderSize     = 16 // IHAVEOPT + option + length
	OptionReplyHdrSize   = 20 // magic + option + reply type + length
	RequestSize          = 28
	SimpleReplySize      = 16
	ChunkHeaderSize      = 20
	ExportNameZeroesSize = 124 // padding after NBD_OPT_EXPORT_NAME's reply without NO_ZEROES
)

// Spec limits.
const (
	// MaxNameLength is the longest export name, metadata context name or
	// error message string the spec allows (4096 bytes).
	MaxNameLength = 4096
	// MaxOptionLength bounds the data of a client option. The spec sets no
	// number, but no valid option needs more than a few names of at most
	// 4096 bytes; 64 KiB leaves room for a SET_META_CONTEXT with many queries.
	MaxOptionLength = 64 << 10
	// DefaultMaxPayload is the maximum payload size every server SHOULD
	// support and no client should consider a denial of service (2^25).
	DefaultMaxPayload = 32 << 20
	// MaxMinBlockSize is the largest minimum block size the spec allows.
	MaxMinBlockSize = 64 << 10
	// MaxDFRead is the read length a server MUST serve unfragmented with DF.
	MaxDFRead = 64 << 10
	// MaxBlockStatusDescriptors bounds one BLOCK_STATUS chunk (spec: 2^20).
	MaxBlockStatusDescriptors = 1 << 20
)

// Handshake flags (16 bits, server → client).
const (
	FlagFixedNewstyle uint16 = 1 << 0
	FlagNoZeroes      uint16 = 1 << 1
)

// Client flags (32 bits, client → server).
const (
	FlagCFixedNewstyle uint32 = 1 << 0
	FlagCNoZeroes      uint32 = 1 << 1
)

// Transmission flags (16 bits).
const (
	FlagHasFlags           uint16 = 1 << 0
	FlagReadOnly           uint16 = 1 << 1
	FlagSendFlush          uint16 = 1 << 2
	FlagSendFUA            uint16 = 1 << 3
	FlagRotational         uint16 = 1 << 4
	FlagSendTrim           uint16 = 1 << 5
	FlagSendWriteZeroes    uint16 = 1 << 6
	FlagSendDF             uint16 = 1 << 7
	FlagCanMultiConn       uint16 = 1 << 8
	FlagSendResize         uint16 = 1 << 9 // experimental RESIZE extension
	FlagSendCache          uint16 = 1 << 10
	FlagSendFastZero       uint16 = 1 << 11
	FlagBlockStatusPayload uint16 = 1 << 12 // experimental EXTENDED_HEADERS extension
)

// Opt is an option type sent by the client during option haggling.
type Opt uint32

// Option types.
const (
	OptExportName      Opt = 1
	OptAbort           Opt = 2
	OptList            Opt = 3
	OptPeekExport      Opt = 4 // withdrawn
	OptStartTLS        Opt = 5
	OptInfo            Opt = 6
	OptGo              Opt = 7
	OptStructuredReply Opt = 8
	OptListMetaContext Opt = 9
	OptSetMetaContext  Opt = 10
	OptExtendedHeaders Opt = 11
)

var optNames = map[Opt]string{
	OptExportName: "NBD_OPT_EXPORT_NAME", OptAbort: "NBD_OPT_ABORT", OptList: "NBD_OPT_LIST",
	OptPeekExport: "NBD_OPT_PEEK_EXPORT", OptStartTLS: "NBD_OPT_STARTTLS", OptInfo: "NBD_OPT_INFO",
	OptGo: "NBD_OPT_GO", OptStructuredReply: "NBD_OPT_STRUCTURED_REPLY",
	OptListMetaContext: "NBD_OPT_LIST_META_CONTEXT", OptSetMetaContext: "NBD_OPT_SET_META_CONTEXT",
	OptExtendedHeaders: "NBD_OPT_EXTENDED_HEADERS",
}

func (o Opt) String() string {
	if s, ok := optNames[o]; ok {
		return s
	}
	return "NBD_OPT_" + strconv.FormatUint(uint64(o), 10)
}

// Rep is an option reply type. Values with bit 31 set are errors.
type Rep uint32

// Option reply types.
const (
	RepAck         Rep = 1
	RepServer      Rep = 2
	RepInfo        Rep = 3
	RepMetaContext Rep = 4

	RepFlagError        Rep = 1 << 31
	RepErrUnsup         Rep = RepFlagError | 1
	RepErrPolicy        Rep = RepFlagError | 2
	RepErrInvalid       Rep = RepFlagError | 3
	RepErrPlatform      Rep = RepFlagError | 4
	RepErrTLSReqd       Rep = RepFlagError | 5
	RepErrUnknown       Rep = RepFlagError | 6
	RepErrShutdown      Rep = RepFlagError | 7
	RepErrBlockSizeReqd Rep = RepFlagError | 8
	RepErrTooBig        Rep = RepFlagError | 9
	RepErrExtHeaderReqd Rep = RepFlagError | 10
)

var repNames = map[Rep]string{
	RepAck: "NBD_REP_ACK", RepServer: "NBD_REP_SERVER", RepInfo: "NBD_REP_INFO", RepMetaContext: "NBD_REP_META_CONTEXT",
	RepErrUnsup: "NBD_REP_ERR_UNSUP", RepErrPolicy: "NBD_REP_ERR_POLICY", RepErrInvalid: "NBD_REP_ERR_INVALID",
	RepErrPlatform: "NBD_REP_ERR_PLATFORM", RepErrTLSReqd: "NBD_REP_ERR_TLS_REQD", RepErrUnknown: "NBD_REP_ERR_UNKNOWN",
	RepErrShutdown: "NBD_REP_ERR_SHUTDOWN", RepErrBlockSizeReqd: "NBD_REP_ERR_BLOCK_SIZE_REQD",
	RepErrTooBig: "NBD_REP_ERR_TOO_BIG", RepErrExtHeaderReqd: "NBD_REP_ERR_EXT_HEADER_REQD",
}

func (r Rep) String() string {
	if s, ok := repNames[r]; ok {
		return s
	}
	return "NBD_REP_" + strconv.FormatUint(uint64(r), 10)
}

// IsError reports whether r is an error reply (bit 31 set).
func (r Rep) IsError() bool { return r&RepFlagError != 0 }

// InfoType is an NBD_INFO_* item inside NBD_OPT_INFO/GO requests and NBD_REP_INFO replies.
type InfoType uint16

// Information types.
const (
	InfoExport      InfoType = 0
	InfoName        InfoType = 1
	InfoDescription InfoType = 2
	InfoBlockSize   InfoType = 3
)

func (t InfoType) String() string {
	switch t {
	case InfoExport:
		return "NBD_INFO_EXPORT"
	case InfoName:
		return "NBD_INFO_NAME"
	case InfoDescription:
		return "NBD_INFO_DESCRIPTION"
	case InfoBlockSize:
		return "NBD_INFO_BLOCK_SIZE"
	}
	return "NBD_INFO_" + strconv.FormatUint(uint64(t), 10)
}

// Cmd is a transmission-phase request type.
type Cmd uint16

// Request types.
const (
	CmdRead        Cmd = 0
	CmdWrite       Cmd = 1
	CmdDisc        Cmd = 2
	CmdFlush       Cmd = 3
	CmdTrim        Cmd = 4
	CmdCache       Cmd = 5
	CmdWriteZeroes Cmd = 6
	CmdBlockStatus Cmd = 7
	CmdResize      Cmd = 8 // experimental RESIZE extension, not implemented
)

func (c Cmd) String() string {
	switch c {
	case CmdRead:
		return "NBD_CMD_READ"
	case CmdWrite:
		return "NBD_CMD_WRITE"
	case CmdDisc:
		return "NBD_CMD_DISC"
	case CmdFlush:
		return "NBD_CMD_FLUSH"
	case CmdTrim:
		return "NBD_CMD_TRIM"
	case CmdCache:
		return "NBD_CMD_CACHE"
	case CmdWriteZeroes:
		return "NBD_CMD_WRITE_ZEROES"
	case CmdBlockStatus:
		return "NBD_CMD_BLOCK_STATUS"
	case CmdResize:
		return "NBD_CMD_RESIZE"
	}
	return "NBD_CMD_" + strconv.FormatUint(uint64(c), 10)
}

// CmdFlag is the 16-bit command flags field of a request.
type CmdFlag uint16

// Command flags.
const (
	CmdFlagFUA        CmdFlag = 1 << 0
	CmdFlagNoHole     CmdFlag = 1 << 1 // WRITE_ZEROES
	CmdFlagDF         CmdFlag = 1 << 2 // READ with structured replies
	CmdFlagReqOne     CmdFlag = 1 << 3 // BLOCK_STATUS
	CmdFlagFastZero   CmdFlag = 1 << 4 // WRITE_ZEROES
	CmdFlagPayloadLen CmdFlag = 1 << 5 // experimental EXTENDED_HEADERS extension
)

// ReplyFlagDone marks the final chunk of a structured reply.
const ReplyFlagDone uint16 = 1 << 0

// ReplyType is a structured reply chunk type.
type ReplyType uint16

// Structured reply chunk types.
const (
	ReplyTypeNone           ReplyType = 0
	ReplyTypeOffsetData     ReplyType = 1
	ReplyTypeOffsetHole     ReplyType = 2
	ReplyTypeBlockStatus    ReplyType = 5
	ReplyTypeBlockStatusExt ReplyType = 6 // experimental EXTENDED_HEADERS extension

	ReplyTypeFlagError   ReplyType = 1 << 15
	ReplyTypeError       ReplyType = ReplyTypeFlagError | 1
	ReplyTypeErrorOffset ReplyType = ReplyTypeFlagError | 2
)

func (t ReplyType) String() string {
	switch t {
	case ReplyTypeNone:
		return "NBD_REPLY_TYPE_NONE"
	case ReplyTypeOffsetData:
		return "NBD_REPLY_TYPE_OFFSET_DATA"
	case ReplyTypeOffsetHole:
		return "NBD_REPLY_TYPE_OFFSET_HOLE"
	case ReplyTypeBlockStatus:
		return "NBD_REPLY_TYPE_BLOCK_STATUS"
	case ReplyTypeBlockStatusExt:
		return "NBD_REPLY_TYPE_BLOCK_STATUS_EXT"
	case ReplyTypeError:
		return "NBD_REPLY_TYPE_ERROR"
	case ReplyTypeErrorOffset:
		return "NBD_REPLY_TYPE_ERROR_OFFSET"
	}
	return "NBD_REPLY_TYPE_" + strconv.FormatUint(uint64(t), 10)
}

// IsError reports whether t is an error chunk type (bit 15 set).
func (t ReplyType) IsError() bool { return t&ReplyTypeFlagError != 0 }

// base:allocation status flags (NBD_STATE_*).
const (
	StateHole uint32 = 1 << 0
	StateZero uint32 = 1 << 1
)

// MetaContextBaseAllocation is the one metadata context the spec defines.
const MetaContextBaseAllocation = "base:allocation"
