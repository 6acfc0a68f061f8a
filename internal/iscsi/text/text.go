package text

import (
	"errors"
	"fmt"
)

// Limits from RFC 7143 6.1.
const (
	// MaxKeyLen is the longest key-name the RFC allows (63 bytes).
	MaxKeyLen = 63
	// MaxValueLen is the RFC's default bound on a value (255 bytes) for
	// keys without their own (Key.MaxLen).
	MaxValueLen = 255
	// MaxBinaryValueLen bounds binary values such as CHAP_C and CHAP_R in
	// their text form (0x + 2 hex digits per byte of a 1024-byte value);
	// an implementation bound that keeps a login's memory small.
	MaxBinaryValueLen = 2 + 2*1024
	// DefaultMaxTotal is the default bound on the text of one exchange
	// (all the PDUs of a C-bit sequence together): enough for a
	// SendTargets answer listing hundreds of targets.
	DefaultMaxTotal = 64 << 10
)

// Errors. Functions wrap these with detail; match with errors.Is.
var (
	// ErrSyntax: an entry is not key=value, or a key has characters the
	// RFC does not allow.
	ErrSyntax = errors.New("iscsi text: syntax error")
	// ErrTooLong: a key, value or the whole text exceeds its bound.
	ErrTooLong = errors.New("iscsi text: too long")
	// ErrDuplicate: a key appears twice in one exchange (RFC 7143 6.1
	// forbids it; a target fails the login with Initiator error or rejects
	// the Text Request).
	ErrDuplicate = errors.New("iscsi text: duplicate key")
	// ErrValue: a value is outside the key's range or not one of its
	// values.
	ErrValue = errors.New("iscsi text: invalid value")
)

// KeyError names the key an error is about.
type KeyError struct {
	Key string
	Msg string
	Err error
}

func (e *KeyError) Error() string { return fmt.Sprintf("iscsi text: key %q: %s", e.Key, e.Msg) }
func (e *KeyError) Unwrap() error { return e.Err }

// Pair is one key=value entry.
type Pair struct{ Key, Value string }

// Parse splits a complete text (the concatenated data segments of one
// exchange) into its key=value pairs, in order. It enforces the key and
// value length bounds (per key from the Keys table, MaxValueLen otherwise),
// the key-name character set, and rejects duplicate keys. Trailing NUL
// bytes (padding some initiators leave) are ignored.
//
// Parse allocates only for the returned pairs; the text is already bounded
// by the Accumulator (or the PDU reader's data segment limit).
func Parse(data []byte) ([]Pair, error) {
	var out []Pair
	seen := make(map[string]struct{})
	for len(data) > 0 {
		i := 0
		for i < len(data) && data[i] != 0 {
			i++
		}
		entry := data[:i]
		if i < len(data) {
			data = data[i+1:]
		} else {
			data = nil
		}
		if len(entry) == 0 {
			// Only trailing NULs are tolerated: an empty entry followed by
			// more text is malformed.
			for _, c := range data {
				if c != 0 {
					return nil, fmt.Errorf("%w: empty entry", ErrSyntax)
				}
			}
			break
		}
		eq := -1
		for j, c := range entry {
			if c == '=' {
				eq = j
				break
			}
		}
		if eq < 0 {
			return nil, fmt.Errorf("%w: %q has no '='", ErrSyntax, clip(entry))
		}
		key, val := string(entry[:eq]), entry[eq+1:]
		if err := CheckKey(key); err != nil {
			return nil, err
		}
		if len(val) > MaxLen(key) {
			return nil, &KeyError{Key: key, Msg: fmt.Sprintf("value of %d bytes exceeds %d", len(val), MaxLen(key)), Err: ErrTooLong}
		}
		if _, dup := seen[key]; dup {
			return nil, &KeyError{Key: key, Msg: "sent twice", Err: ErrDuplicate}
		}
		seen[key] = struct{}{}
		out = append(out, Pair{Key: key, Value: string(val)})
	}
	return out, nil
}

func clip(b []byte) string {
	if len(b) > 40 {
		return string(b[:40]) + "..."
	}
	return string(b)
}

// CheckKey validates a key-name: 1..63 bytes of letters, digits and
// ". - + @ _" (RFC 7143 6.1, standard-label plus the X- / X# vendor
// prefixes' characters).
func CheckKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrSyntax)
	}
	if len(key) > MaxKeyLen {
		return &KeyError{Key: key[:MaxKeyLen] + "...", Msg: fmt.Sprintf("key of %d bytes exceeds %d", len(key), MaxKeyLen), Err: ErrTooLong}
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.' || c == '-' || c == '+' || c == '@' || c == '_' || c == '#':
		default:
			return &KeyError{Key: key, Msg: fmt.Sprintf("character %q not allowed in a key", c), Err: ErrSyntax}
		}
	}
	return nil
}

// MaxLen returns the value length bound for key.
func MaxLen(key string) int {
	if k, ok := Keys[key]; ok && k.MaxLen > 0 {
		return k.MaxLen
	}
	return MaxValueLen
}

// Append encodes pairs as key=value\0 entries in order. It validates keys
// and value lengths as Parse does (so what Append produces Parse accepts),
// but not duplicates: SendTargets answers repeat TargetAddress.
func Append(dst []byte, pairs ...Pair) ([]byte, error) {
	for _, p := range pairs {
		if err := CheckKey(p.Key); err != nil {
			return dst, err
		}
		if len(p.Value) > MaxLen(p.Key) {
			return dst, &KeyError{Key: p.Key, Msg: fmt.Sprintf("value of %d bytes exceeds %d", len(p.Value), MaxLen(p.Key)), Err: ErrTooLong}
		}
		for i := 0; i < len(p.Value); i++ {
			if p.Value[i] == 0 {
				return dst, &KeyError{Key: p.Key, Msg: "NUL in value", Err: ErrSyntax}
			}
		}
		dst = append(dst, p.Key...)
		dst = append(dst, '=')
		dst = append(dst, p.Value...)
		dst = append(dst, 0)
	}
	return dst, nil
}

// ParseList parses a text that may repeat keys (a SendTargets answer:
// TargetName then its TargetAddress entries), keeping order. Same bounds
// as Parse except duplicates.
func ParseList(data []byte) ([]Pair, error) {
	var out []Pair
	for len(data) > 0 {
		i := 0
		for i < len(data) && data[i] != 0 {
			i++
		}
		entry := data[:i]
		data = data[min(len(data), i+1):]
		if len(entry) == 0 {
			continue
		}
		key, val, ok := cut(entry)
		if !ok {
			return nil, fmt.Errorf("%w: %q has no '='", ErrSyntax, clip(entry))
		}
		if err := CheckKey(key); err != nil {
			return nil, err
		}
		if len(val) > MaxLen(key) {
			return nil, &KeyError{Key: key, Msg: "value too long", Err: ErrTooLong}
		}
		out = append(out, Pair{key, val})
	}
	return out, nil
}

func cut(e []byte) (string, string, bool) {
	for j, c := range e {
		if c == '=' {
			return string(e[:j]), string(e[j+1:]), true
		}
	}
	return "", "", false
}

// Accumulator joins the data segments of a C-bit (Continue) sequence of
// Login or Text PDUs into one text, refusing to grow past Max. A key=value
// entry may straddle PDUs, so parsing waits for the final PDU.
//
// Simplest use:
//
//	var acc text.Accumulator // Max 0 means DefaultMaxTotal
//	done, err := acc.Add(f.Data, req.Continue)
//	if done { pairs, err := text.Parse(acc.Take()) }
type Accumulator struct {
	Max int
	buf []byte
}

// Add appends one PDU's data segment; cont is the PDU's C bit. It returns
// true when the text is complete (cont false). Exceeding Max is ErrTooLong,
// checked before the bytes are copied.
func (a *Accumulator) Add(data []byte, cont bool) (bool, error) {
	max := a.Max
	if max <= 0 {
		max = DefaultMaxTotal
	}
	if len(a.buf)+len(data) > max {
		a.buf = nil
		return false, fmt.Errorf("%w: text of more than %d bytes across continued PDUs", ErrTooLong, max)
	}
	a.buf = append(a.buf, data...)
	return !cont, nil
}

// Len returns the bytes accumulated so far.
func (a *Accumulator) Len() int { return len(a.buf) }

// Take returns the accumulated text and resets the accumulator.
func (a *Accumulator) Take() []byte {
	b := a.buf
	a.buf = nil
	return b
}

// Split cuts an encoded text into chunks of at most max bytes (the peer's
// MaxRecvDataSegmentLength) to send in PDUs with the C bit set on all but
// the last. Chunks alias text.
func Split(text []byte, max int) [][]byte {
	if max <= 0 {
		max = 8192
	}
	var out [][]byte
	for len(text) > max {
		out = append(out, text[:max])
		text = text[max:]
	}
	return append(out, text)
}
