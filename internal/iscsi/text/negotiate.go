package text

import (
	"fmt"
	"strconv"
	"strings"
)

// Special answer values (RFC 7143 6.2).
const (
	Reject        = "Reject"
	Irrelevant    = "Irrelevant"
	NotUnderstood = "NotUnderstood"
)

// Outcome classifies a responder's answer to one offered key.
type Outcome uint8

const (
	Agreed           Outcome = iota // Answer is the negotiated value
	Declared                        // a declarative key: no answer is owed
	Rejected                        // Answer is "Reject": the value was invalid
	IrrelevantKey                   // Answer is "Irrelevant"
	NotUnderstoodKey                // Answer is "NotUnderstood"
)

// Answer is what a responder sends back for one offered key.
type Answer struct {
	Key     string
	Value   string // the text to send ("" for Declared)
	Result  string // the value now in force ("" unless Agreed or Declared)
	Outcome Outcome
}

// Respond computes the responder's answer to an offered key=value, given
// the responder's own value for it (for List keys, the values it supports,
// comma-separated, in any order). discovery says the session is a
// discovery session, where keys that only matter for SCSI transfers are
// answered Irrelevant.
//
// The rules (RFC 7143 6.2-6.3): List picks the first offered value the
// responder supports, else Reject; And/Or combine Booleans; Min/Max pick
// the smaller/larger number; Declarative keys owe no answer. A value that
// is not valid for the key (syntax or range) is answered Reject, as is
// "Reject"/"Irrelevant"/"NotUnderstood" offered as a value. Unknown keys are
// answered NotUnderstood, except X- and X# vendor keys, which the RFC
// also says must be answered NotUnderstood when not supported.
func Respond(offer Pair, ours string, discovery bool) Answer {
	a := Answer{Key: offer.Key}
	k, ok := Keys[offer.Key]
	if !ok {
		a.Value, a.Outcome = NotUnderstood, NotUnderstoodKey
		return a
	}
	if discovery && k.Use&UseDiscovery == 0 && k.Kind != Declarative {
		a.Value, a.Outcome = Irrelevant, IrrelevantKey
		return a
	}
	reject := func() Answer { a.Value, a.Outcome = Reject, Rejected; return a }
	switch k.Kind {
	case Declarative:
		if err := Validate(k, offer.Value); err != nil {
			return reject()
		}
		a.Result, a.Outcome = offer.Value, Declared
		if k.Name == "OFMarkInt" || k.Name == "IFMarkInt" {
			a.Value, a.Result, a.Outcome = Irrelevant, "", IrrelevantKey
		}
		return a
	case List:
		supported := strings.Split(ours, ",")
		for _, v := range strings.Split(offer.Value, ",") {
			if v == "" || len(v) > MaxValueLen {
				return reject()
			}
			for _, s := range supported {
				if v == s {
					a.Value, a.Result, a.Outcome = v, v, Agreed
					return a
				}
			}
		}
		return reject()
	case And, Or:
		o, ok1 := ParseBool(offer.Value)
		m, ok2 := ParseBool(ours)
		if !ok1 || !ok2 {
			return reject()
		}
		r := o && m
		if k.Kind == Or {
			r = o || m
		}
		a.Value, a.Result, a.Outcome = FormatBool(r), FormatBool(r), Agreed
		return a
	case Min, Max:
		if Validate(k, offer.Value) != nil {
			return reject()
		}
		o, _ := ParseNumber(offer.Value)
		m, ok := ParseNumber(ours)
		if !ok {
			return reject()
		}
		r := min(o, m)
		if k.Kind == Max {
			r = max(o, m)
		}
		s := strconv.FormatUint(r, 10)
		a.Value, a.Result, a.Outcome = s, s, Agreed
		return a
	}
	return reject()
}

// Validate checks a value against the key's syntax and range.
func Validate(k *Key, v string) error {
	bad := func(format string, args ...any) error {
		return &KeyError{Key: k.Name, Msg: fmt.Sprintf(format, args...), Err: ErrValue}
	}
	if v == Reject || v == Irrelevant || v == NotUnderstood {
		return bad("%q is an answer, not a value", v)
	}
	if len(v) > MaxLen(k.Name) {
		return &KeyError{Key: k.Name, Msg: "value too long", Err: ErrTooLong}
	}
	switch k.Kind {
	case And, Or:
		if _, ok := ParseBool(v); !ok {
			return bad("%q is not Yes or No", v)
		}
	case Min, Max:
		n, ok := ParseNumber(v)
		if !ok {
			return bad("%q is not a number", v)
		}
		if n < k.Lo || n > k.Hi {
			return bad("%d outside %d..%d", n, k.Lo, k.Hi)
		}
	case List:
		for _, e := range strings.Split(v, ",") {
			if e == "" {
				return bad("empty list element")
			}
		}
	case Declarative:
		if k.Numeric {
			n, ok := ParseNumber(v)
			if !ok {
				return bad("%q is not a number", v)
			}
			if n < k.Lo || n > k.Hi {
				return bad("%d outside %d..%d", n, k.Lo, k.Hi)
			}
		}
		if len(k.Values) > 0 {
			for _, allowed := range k.Values {
				if v == allowed {
					return nil
				}
			}
			return bad("%q is not one of %v", v, k.Values)
		}
	}
	return nil
}

// Settle is the offerer's side: given what it offered and the responder's
// answer, it returns the value in force, or an error if the answer breaks
// the rules (a List answer not from the offer, a Min answer above the
// offer, an AND answer of Yes to an offer of No...). A Reject,
// Irrelevant or NotUnderstood answer leaves the key at its default.
func Settle(key, offered, answer string) (string, error) {
	k, ok := Keys[key]
	if !ok {
		if answer == NotUnderstood {
			return "", nil
		}
		return "", &KeyError{Key: key, Msg: "unknown key answered " + answer, Err: ErrValue}
	}
	switch answer {
	case Reject, Irrelevant, NotUnderstood:
		return k.Default, nil
	}
	bad := func(why string) (string, error) {
		return "", &KeyError{Key: key, Msg: fmt.Sprintf("answer %q to offer %q: %s", answer, offered, why), Err: ErrValue}
	}
	if err := Validate(k, answer); err != nil {
		return "", err
	}
	switch k.Kind {
	case List:
		for _, v := range strings.Split(offered, ",") {
			if v == answer {
				return answer, nil
			}
		}
		return bad("not one of the offered values")
	case And:
		o, _ := ParseBool(offered)
		if a, _ := ParseBool(answer); a && !o {
			return bad("AND cannot turn No into Yes")
		}
	case Or:
		o, _ := ParseBool(offered)
		if a, _ := ParseBool(answer); !a && o {
			return bad("OR cannot turn Yes into No")
		}
	case Min:
		o, _ := ParseNumber(offered)
		if a, _ := ParseNumber(answer); a > o {
			return bad("above the offered minimum")
		}
	case Max:
		o, _ := ParseNumber(offered)
		if a, _ := ParseNumber(answer); a < o {
			return bad("below the offered maximum")
		}
	}
	return answer, nil
}

// Params are the operational values of a session (and one connection)
// after negotiation; Defaults returns the RFC's defaults.
type Params struct {
	HeaderDigest, DataDigest bool // CRC32C
	MaxConnections           uint64
	InitialR2T               bool
	ImmediateData            bool
	// MaxRecvDataSegmentLength is the declaring side's receive limit; a
	// session keeps one per direction.
	MaxRecvDataSegmentLength uint64
	// PeerMaxRecvDataSegmentLength is what the other side declared: the
	// bound on the data segments this side sends.
	PeerMaxRecvDataSegmentLength uint64
	MaxBurstLength               uint64
	FirstBurstLength             uint64
	DefaultTime2Wait             uint64
	DefaultTime2Retain           uint64
	MaxOutstandingR2T            uint64
	DataPDUInOrder               bool
	DataSequenceInOrder          bool
	ErrorRecoveryLevel           uint64
	SessionType                  string
}

// Defaults returns the RFC 7143 chapter 13 defaults.
func Defaults() Params {
	var p Params
	for _, k := range Keys {
		if k.Default != "" {
			_ = p.Set(k.Name, k.Default)
		}
	}
	p.PeerMaxRecvDataSegmentLength = p.MaxRecvDataSegmentLength
	return p
}

// Set stores a negotiated value; unknown keys and keys without a Params
// field are ignored (nil error).
func (p *Params) Set(key, v string) error {
	k, ok := Keys[key]
	if !ok {
		return nil
	}
	if err := Validate(k, v); err != nil {
		return err
	}
	n, _ := ParseNumber(v)
	b, _ := ParseBool(v)
	switch key {
	case "HeaderDigest":
		p.HeaderDigest = v == "CRC32C"
	case "DataDigest":
		p.DataDigest = v == "CRC32C"
	case "MaxConnections":
		p.MaxConnections = n
	case "InitialR2T":
		p.InitialR2T = b
	case "ImmediateData":
		p.ImmediateData = b
	case "MaxRecvDataSegmentLength":
		p.MaxRecvDataSegmentLength = n
	case "MaxBurstLength":
		p.MaxBurstLength = n
	case "FirstBurstLength":
		p.FirstBurstLength = n
	case "DefaultTime2Wait":
		p.DefaultTime2Wait = n
	case "DefaultTime2Retain":
		p.DefaultTime2Retain = n
	case "MaxOutstandingR2T":
		p.MaxOutstandingR2T = n
	case "DataPDUInOrder":
		p.DataPDUInOrder = b
	case "DataSequenceInOrder":
		p.DataSequenceInOrder = b
	case "ErrorRecoveryLevel":
		p.ErrorRecoveryLevel = n
	case "SessionType":
		p.SessionType = v
	}
	return nil
}

// Check validates the cross-key rules: FirstBurstLength must not exceed
// MaxBurstLength (RFC 7143 13.14), and every numerical value must be in
// its key's range.
func (p *Params) Check() error {
	if p.FirstBurstLength > p.MaxBurstLength {
		return &KeyError{Key: "FirstBurstLength", Msg: fmt.Sprintf("%d exceeds MaxBurstLength %d", p.FirstBurstLength, p.MaxBurstLength), Err: ErrValue}
	}
	for _, c := range []struct {
		k string
		v uint64
	}{{"MaxConnections", p.MaxConnections}, {"MaxRecvDataSegmentLength", p.MaxRecvDataSegmentLength},
		{"MaxBurstLength", p.MaxBurstLength}, {"FirstBurstLength", p.FirstBurstLength},
		{"DefaultTime2Wait", p.DefaultTime2Wait}, {"DefaultTime2Retain", p.DefaultTime2Retain},
		{"MaxOutstandingR2T", p.MaxOutstandingR2T}, {"ErrorRecoveryLevel", p.ErrorRecoveryLevel}} {
		k := Keys[c.k]
		if c.v < k.Lo || c.v > k.Hi {
			return &KeyError{Key: c.k, Msg: fmt.Sprintf("%d outside %d..%d", c.v, k.Lo, k.Hi), Err: ErrValue}
		}
	}
	return nil
}

// Negotiate answers every offered pair of one exchange, in order, against
// the responder's values in ours (key → value; for List keys the supported
// values; a key missing from ours uses the key's default), and applies the
// results to p. It returns the answers to send (declarative keys produce no
// answer; a declared MaxRecvDataSegmentLength lands in
// p.PeerMaxRecvDataSegmentLength, and the responder declares its own
// separately). After the exchange it enforces FirstBurstLength <=
// MaxBurstLength by lowering the FirstBurstLength answer, which is still a
// valid numerical-min answer.
func Negotiate(p *Params, offers []Pair, ours map[string]string, discovery bool) []Pair {
	var out []Pair
	for _, o := range offers {
		mine, ok := ours[o.Key]
		if !ok {
			if k := Keys[o.Key]; k != nil {
				mine = k.Default
				if k.Kind == List {
					mine = strings.Join(k.Values, ",")
					if o.Key == "AuthMethod" || o.Key == "HeaderDigest" || o.Key == "DataDigest" {
						// Security and digests are opt-in: by default a
						// responder offers only the RFC default.
						mine = k.Default
					}
				}
			}
		}
		a := Respond(o, mine, discovery)
		switch {
		case a.Outcome == Declared && o.Key == "MaxRecvDataSegmentLength":
			p.PeerMaxRecvDataSegmentLength, _ = ParseNumber(a.Result)
		case a.Outcome == Agreed || a.Outcome == Declared:
			_ = p.Set(o.Key, a.Result)
		}
		if a.Outcome != Declared {
			out = append(out, Pair{o.Key, a.Value})
		}
	}
	if p.FirstBurstLength > p.MaxBurstLength {
		p.FirstBurstLength = p.MaxBurstLength
		for i := range out {
			// Only a numerical answer is lowered; a Reject (or Irrelevant)
			// stays what it is, and the key falls back as the RFC says.
			if _, num := ParseNumber(out[i].Value); out[i].Key == "FirstBurstLength" && num {
				out[i].Value = strconv.FormatUint(p.FirstBurstLength, 10)
			}
		}
	}
	return out
}
