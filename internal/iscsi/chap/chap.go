// Package chap is iSCSI's CHAP authentication (RFC 1994 with the iSCSI
// rules of RFC 7143 12.1.3): CHAP_A / CHAP_I / CHAP_C / CHAP_N / CHAP_R,
// MD5 responses, one-way and mutual authentication, and the checks the RFC
// asks of a target (reflected challenges, reused challenges, identical
// secrets in both directions). It does no I/O: keys come in and go out as
// text.Pair values that the login code carries in Login PDUs.
//
// Simplest use, a target authenticating an initiator:
//
//	ch, out, err := chap.Begin(offers["CHAP_A"], rand.Reader) // out: CHAP_A=5, CHAP_I, CHAP_C
//	...next Login Request...
//	out, err = chap.Verify(ch, offers, chap.Secrets{Lookup: lookup}, cache)
//	// err wraps chap.ErrAuthFailed: answer Login status 0x0201
//
// Concurrency: Cache is safe for concurrent use; everything else is pure.
package chap

import (
	"crypto/md5"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"

	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// AlgorithmMD5 is the CHAP_A value for MD5 (RFC 1994; the only algorithm
// RFC 7143 requires).
const AlgorithmMD5 = 5

// Bounds.
const (
	// ChallengeLen is the length of the challenges Begin generates.
	ChallengeLen = 16
	// MaxBinaryLen bounds a decoded CHAP_C or CHAP_R (1024 bytes);
	// a longer text value is refused before decoding.
	MaxBinaryLen = 1024
	// MinSecretLen: RFC 7143 12.1.3 asks for secrets of at least 96 bits
	// when the connection is not protected by IPsec.
	MinSecretLen = 12
	// MaxSecretLen bounds configured secrets.
	MaxSecretLen = 255
)

var (
	// ErrAuthFailed: the peer's response is wrong, its name unknown, or
	// the exchange broke a rule; a target answers Login status 0x0201
	// (Authentication failure).
	ErrAuthFailed = errors.New("chap: authentication failed")
	// ErrFormat: a CHAP_* value is malformed, missing or out of bounds;
	// also answered with 0x0201, but distinguishable in logs.
	ErrFormat = errors.New("chap: malformed value")
	// ErrSecret: a configured secret is unusable (too short, or the same
	// in both directions of mutual CHAP).
	ErrSecret = errors.New("chap: unusable secret")
)

func formatErr(key, format string, a ...any) error {
	return fmt.Errorf("%w: %s: %s", ErrFormat, key, fmt.Sprintf(format, a...))
}

// EncodeBinary returns the 0x-hex form of a binary value.
func EncodeBinary(b []byte) string { return "0x" + hex.EncodeToString(b) }

// DecodeBinary parses a binary value in hex ("0x..." or "0X...") or base64
// ("0b..." or "0B...") form (RFC 7143 5.1), refusing text that could decode
// to more than max bytes before decoding it. An odd number of hex digits is
// read as if a leading zero were present.
func DecodeBinary(s string, max int) ([]byte, error) {
	if len(s) < 3 || s[0] != '0' {
		return nil, fmt.Errorf("%w: %q is not 0x-hex or 0b-base64", ErrFormat, clip(s))
	}
	body := s[2:]
	switch s[1] {
	case 'x', 'X':
		if (len(body)+1)/2 > max {
			return nil, fmt.Errorf("%w: %d hex digits exceed %d bytes", ErrFormat, len(body), max)
		}
		if len(body)%2 == 1 {
			body = "0" + body
		}
		b, err := hex.DecodeString(body)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFormat, err)
		}
		return b, nil
	case 'b', 'B':
		if base64.StdEncoding.DecodedLen(len(body)) > max+2 {
			return nil, fmt.Errorf("%w: %d base64 characters exceed %d bytes", ErrFormat, len(body), max)
		}
		if strings.ContainsAny(body, "\r\n") {
			// encoding/base64 skips line breaks; a text value has none.
			return nil, fmt.Errorf("%w: line break in base64 value", ErrFormat)
		}
		b, err := base64.StdEncoding.DecodeString(body)
		if err == nil && len(b) == 0 {
			err = errors.New("empty value")
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrFormat, err)
		}
		if len(b) > max {
			return nil, fmt.Errorf("%w: %d bytes exceed %d", ErrFormat, len(b), max)
		}
		return b, nil
	}
	return nil, fmt.Errorf("%w: %q is not 0x-hex or 0b-base64", ErrFormat, clip(s))
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// Response computes the CHAP MD5 response: MD5(identifier || secret ||
// challenge) (RFC 1994 4.1).
func Response(id byte, secret, challenge []byte) [md5.Size]byte {
	h := md5.New()
	h.Write([]byte{id})
	h.Write(secret)
	h.Write(challenge)
	var out [md5.Size]byte
	h.Sum(out[:0])
	return out
}

// Check reports whether resp is the right response, comparing in constant
// time so that timing reveals nothing about the expected value.
func Check(id byte, secret, challenge, resp []byte) bool {
	want := Response(id, secret, challenge)
	return subtle.ConstantTimeCompare(want[:], resp) == 1
}

// ParseID parses CHAP_I: a number 0..255 (decimal or 0x hex).
func ParseID(s string) (byte, error) {
	n, ok := text.ParseNumber(s)
	if !ok || n > 255 {
		return 0, formatErr("CHAP_I", "%q is not 0..255", clip(s))
	}
	return byte(n), nil
}

// SelectAlgorithm picks MD5 from the initiator's CHAP_A list, the only
// algorithm this package implements; Reject otherwise (RFC 7143 12.1.3:
// the target answers CHAP_A=Reject and fails the login... here the error).
func SelectAlgorithm(offer string) error {
	for _, v := range strings.Split(offer, ",") {
		if n, ok := text.ParseNumber(v); ok && n == AlgorithmMD5 {
			return nil
		}
	}
	return fmt.Errorf("%w: CHAP_A=%q does not offer MD5 (5)", ErrAuthFailed, clip(offer))
}

// CheckSecrets validates configured secrets: each at least MinSecretLen
// bytes, and for mutual CHAP the two directions must differ (RFC 7143
// 12.1.3: the same secret both ways lets an attacker reflect challenges).
// targetSecret may be nil for one-way CHAP.
func CheckSecrets(initiatorSecret, targetSecret []byte) error {
	check := func(s []byte) error {
		if len(s) < MinSecretLen || len(s) > MaxSecretLen {
			return fmt.Errorf("%w: secret of %d bytes, want %d..%d", ErrSecret, len(s), MinSecretLen, MaxSecretLen)
		}
		return nil
	}
	if err := check(initiatorSecret); err != nil {
		return err
	}
	if targetSecret == nil {
		return nil
	}
	if err := check(targetSecret); err != nil {
		return err
	}
	if subtle.ConstantTimeCompare(initiatorSecret, targetSecret) == 1 {
		return fmt.Errorf("%w: mutual CHAP secrets must differ in each direction", ErrSecret)
	}
	return nil
}

// Challenge is one challenge an authenticator sent.
type Challenge struct {
	ID    byte
	Value []byte
}

// NewChallenge draws an identifier and ChallengeLen challenge bytes from
// rand (crypto/rand.Reader in production).
func NewChallenge(rand io.Reader) (Challenge, error) {
	b := make([]byte, 1+ChallengeLen)
	if _, err := io.ReadFull(rand, b); err != nil {
		return Challenge{}, err
	}
	return Challenge{ID: b[0], Value: b[1:]}, nil
}

// Begin is the target's answer to the initiator's CHAP_A offer: CHAP_A=5,
// a fresh CHAP_I and CHAP_C.
func Begin(chapA string, rand io.Reader) (Challenge, []text.Pair, error) {
	if err := SelectAlgorithm(chapA); err != nil {
		return Challenge{}, []text.Pair{{Key: "CHAP_A", Value: text.Reject}}, err
	}
	ch, err := NewChallenge(rand)
	if err != nil {
		return Challenge{}, nil, err
	}
	return ch, []text.Pair{
		{Key: "CHAP_A", Value: strconv.Itoa(AlgorithmMD5)},
		{Key: "CHAP_I", Value: strconv.Itoa(int(ch.ID))},
		{Key: "CHAP_C", Value: EncodeBinary(ch.Value)},
	}, nil
}

// Secrets is what the target knows.
type Secrets struct {
	// Lookup returns the secret of the initiator-side CHAP name
	// (CHAP_N), false when the name is unknown.
	Lookup func(name string) ([]byte, bool)
	// TargetName and TargetSecret answer a mutual CHAP challenge; empty
	// TargetSecret means the target refuses mutual CHAP.
	TargetName   string
	TargetSecret []byte
}

// Verify checks the initiator's CHAP_N/CHAP_R against ch, and, when the
// initiator also sent CHAP_I/CHAP_C (mutual CHAP), answers with the
// target's CHAP_N/CHAP_R. It enforces the RFC 7143 12.1.3 rules: the
// initiator's challenge must not equal the target's (reflection), must not
// have been seen before on this target (cache; nil disables), and the
// secrets must differ per direction. Any failure wraps ErrAuthFailed or
// ErrFormat.
func Verify(ch Challenge, offers map[string]string, s Secrets, cache *Cache) ([]text.Pair, error) {
	name, ok := offers["CHAP_N"]
	if !ok || name == "" {
		return nil, formatErr("CHAP_N", "missing")
	}
	r, ok := offers["CHAP_R"]
	if !ok {
		return nil, formatErr("CHAP_R", "missing")
	}
	resp, err := DecodeBinary(r, MaxBinaryLen)
	if err != nil {
		return nil, err
	}
	secret, known := s.Lookup(name)
	if !known {
		// Compare anyway so unknown names cost what wrong secrets cost.
		Check(ch.ID, nil, ch.Value, resp)
		return nil, fmt.Errorf("%w: unknown CHAP_N %q", ErrAuthFailed, clip(name))
	}
	if !Check(ch.ID, secret, ch.Value, resp) {
		return nil, fmt.Errorf("%w: wrong CHAP_R for %q", ErrAuthFailed, clip(name))
	}
	ci, hasI := offers["CHAP_I"]
	cc, hasC := offers["CHAP_C"]
	if !hasI && !hasC {
		return nil, nil
	}
	if !hasI || !hasC {
		return nil, formatErr("CHAP_I/CHAP_C", "mutual CHAP needs both")
	}
	if len(s.TargetSecret) == 0 {
		return nil, fmt.Errorf("%w: initiator asked for mutual CHAP, none configured", ErrAuthFailed)
	}
	if err := CheckSecrets(secret, s.TargetSecret); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAuthFailed, err)
	}
	id, err := ParseID(ci)
	if err != nil {
		return nil, err
	}
	c, err := DecodeBinary(cc, MaxBinaryLen)
	if err != nil {
		return nil, err
	}
	if len(c) == 0 {
		return nil, formatErr("CHAP_C", "empty challenge")
	}
	if subtle.ConstantTimeCompare(c, ch.Value) == 1 {
		return nil, fmt.Errorf("%w: initiator reflected the target's challenge", ErrAuthFailed)
	}
	if cache != nil && !cache.Add(c) {
		return nil, fmt.Errorf("%w: initiator reused a challenge", ErrAuthFailed)
	}
	out := Response(id, s.TargetSecret, c)
	return []text.Pair{
		{Key: "CHAP_N", Value: s.TargetName},
		{Key: "CHAP_R", Value: EncodeBinary(out[:])},
	}, nil
}

// Answer is the initiator's side: given the target's CHAP_I and CHAP_C, it
// returns CHAP_N and CHAP_R, plus CHAP_I/CHAP_C of mutual (non-nil
// mutual) so the caller can later check the target with CheckTarget.
func Answer(offers map[string]string, name string, secret []byte, mutual *Challenge) ([]text.Pair, error) {
	if a, ok := offers["CHAP_A"]; !ok || SelectAlgorithm(a) != nil {
		return nil, formatErr("CHAP_A", "target did not choose MD5")
	}
	id, err := ParseID(offers["CHAP_I"])
	if err != nil {
		return nil, err
	}
	c, err := DecodeBinary(offers["CHAP_C"], MaxBinaryLen)
	if err != nil {
		return nil, err
	}
	r := Response(id, secret, c)
	out := []text.Pair{{Key: "CHAP_N", Value: name}, {Key: "CHAP_R", Value: EncodeBinary(r[:])}}
	if mutual != nil {
		out = append(out, text.Pair{Key: "CHAP_I", Value: strconv.Itoa(int(mutual.ID))},
			text.Pair{Key: "CHAP_C", Value: EncodeBinary(mutual.Value)})
	}
	return out, nil
}

// CheckTarget verifies the target's mutual CHAP answer.
func CheckTarget(mutual Challenge, offers map[string]string, targetName string, targetSecret []byte) error {
	if offers["CHAP_N"] != targetName {
		return fmt.Errorf("%w: target CHAP_N %q, want %q", ErrAuthFailed, clip(offers["CHAP_N"]), targetName)
	}
	r, err := DecodeBinary(offers["CHAP_R"], MaxBinaryLen)
	if err != nil {
		return err
	}
	if !Check(mutual.ID, targetSecret, mutual.Value, r) {
		return fmt.Errorf("%w: wrong target CHAP_R", ErrAuthFailed)
	}
	return nil
}

// Cache remembers recently seen challenges (by MD5 digest, so its memory
// does not depend on challenge length) to refuse reuse. It holds at most
// Max entries, forgetting the oldest first.
type Cache struct {
	Max  int // 0 means 4096
	mu   sync.Mutex
	seen map[[md5.Size]byte]struct{}
	ring [][md5.Size]byte
	next int
}

// Add records c and reports whether it was new.
func (k *Cache) Add(c []byte) bool {
	d := md5.Sum(c)
	k.mu.Lock()
	defer k.mu.Unlock()
	max := k.Max
	if max <= 0 {
		max = 4096
	}
	if k.seen == nil {
		k.seen = make(map[[md5.Size]byte]struct{})
	}
	if _, dup := k.seen[d]; dup {
		return false
	}
	if len(k.ring) < max {
		k.ring = append(k.ring, d)
	} else {
		delete(k.seen, k.ring[k.next])
		k.ring[k.next] = d
		k.next = (k.next + 1) % max
	}
	k.seen[d] = struct{}{}
	return true
}
