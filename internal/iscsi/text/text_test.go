package text

import (
	"bufio"
	"encoding/hex"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

// capturedOffers returns the key=value data segment of every Login and
// Text Request libiscsi sent in the pdu package's golden transcripts
// (byte 0 opcode 0x03/0x04; data after the 48-byte BHS, DataSegmentLength
// from bytes 5..7).
func capturedOffers(t testing.TB) [][]byte {
	var out [][]byte
	for _, name := range []string{"libiscsi-inq.txt", "libiscsi-ls-discovery.txt", "libiscsi-inq-chap.txt", "libiscsi-inq-mutual-chap-crc32c.txt"} {
		f, err := os.Open("../pdu/testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if !strings.HasPrefix(l, "C ") && !strings.HasPrefix(l, "S ") {
				continue
			}
			b, err := hex.DecodeString(l[2:])
			if err != nil || len(b) < 48 {
				t.Fatalf("%s: bad line", name)
			}
			op := b[0] & 0x3f
			if op != 0x03 && op != 0x04 && op != 0x23 && op != 0x24 {
				continue
			}
			n := int(b[5])<<16 | int(b[6])<<8 | int(b[7])
			if 48+n <= len(b) {
				out = append(out, b[48:48+n])
			}
		}
		f.Close()
	}
	if len(out) == 0 {
		t.Fatal("no captured text")
	}
	return out
}

func TestParseCaptured(t *testing.T) {
	var login []Pair
	for _, d := range capturedOffers(t) {
		ps, err := ParseList(d)
		if err != nil {
			t.Fatalf("%q: %v", d, err)
		}
		re, err := Append(nil, ps...)
		if len(d) > 0 && (err != nil || string(re) != strings.TrimRight(string(d), "\x00")+"\x00") {
			t.Errorf("round trip %q -> %q (%v)", d, re, err)
		}
		if len(ps) > 10 && login == nil && ps[0].Key == "InitiatorName" {
			login = ps
		}
	}
	want := []Pair{{"InitiatorName", "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-inq"},
		{"TargetName", "iqn.2026-11.org.vmsan:capture"}, {"SessionType", "Normal"},
		{"HeaderDigest", "None,CRC32C"}, {"DataDigest", "None"}, {"InitialR2T", "No"}, {"ImmediateData", "Yes"},
		{"MaxBurstLength", "262144"}, {"FirstBurstLength", "262144"}}
	if !reflect.DeepEqual(login[:len(want)], want) {
		t.Errorf("libiscsi's login offer starts %v", login[:len(want)])
	}
}

// Negotiating libiscsi's real offer against RFC defaults plus CRC32C.
func TestNegotiateCapturedOffer(t *testing.T) {
	var offer []Pair
	for _, d := range capturedOffers(t) {
		if ps, _ := Parse(d); len(ps) > 10 && ps[1].Key == "TargetName" {
			offer = ps
			break
		}
	}
	p := Defaults()
	ans := Negotiate(&p, offer, map[string]string{"HeaderDigest": "CRC32C,None", "MaxBurstLength": "1048576",
		"FirstBurstLength": "65536", "DefaultTime2Retain": "20"}, false)
	got := map[string]string{}
	for _, a := range ans {
		got[a.Key] = a.Value
	}
	for k, v := range map[string]string{
		"HeaderDigest": "None", // first of the offerer's list we support
		"DataDigest":   "None", "InitialR2T": "Yes" /* OR with our default Yes */, "ImmediateData": "Yes",
		"MaxBurstLength": "262144", "FirstBurstLength": "65536", "DefaultTime2Wait": "2", "DefaultTime2Retain": "0",
		"MaxOutstandingR2T": "1", "ErrorRecoveryLevel": "0", "MaxConnections": "1", "IFMarker": "No", "OFMarker": "No",
	} {
		if got[k] != v {
			t.Errorf("%s answered %q, want %q", k, got[k], v)
		}
	}
	for _, k := range []string{"InitiatorName", "TargetName", "SessionType", "MaxRecvDataSegmentLength"} {
		if _, ok := got[k]; ok {
			t.Errorf("declarative %s answered", k)
		}
	}
	if p.PeerMaxRecvDataSegmentLength != 262144 || p.MaxRecvDataSegmentLength != 8192 || p.FirstBurstLength != 65536 || !p.InitialR2T {
		t.Errorf("params %+v", p)
	}
	if err := p.Check(); err != nil {
		t.Error(err)
	}
}

func TestParseErrors(t *testing.T) {
	long := strings.Repeat("k", 64)
	for _, c := range []struct {
		in   string
		want error
	}{
		{"a=1\x00a=2\x00", ErrDuplicate},
		{long + "=1\x00", ErrTooLong},
		{"TargetAlias=" + strings.Repeat("v", 256) + "\x00", ErrTooLong},
		{"noequals\x00", ErrSyntax},
		{"=v\x00", ErrSyntax},
		{"a b=1\x00", ErrSyntax},
		{"a=1\x00\x00b=2\x00", ErrSyntax},
	} {
		if _, err := Parse([]byte(c.in)); !errors.Is(err, c.want) {
			t.Errorf("Parse(%.30q) = %v, want %v", c.in, err, c.want)
		}
	}
	// Per-key limits: a 223-byte TargetName and a 2 KiB CHAP_C pass.
	ok := "TargetName=" + strings.Repeat("n", 223) + "\x00CHAP_C=0x" + strings.Repeat("ab", 1024) + "\x00"
	if _, err := Parse([]byte(ok + "\x00\x00")); err != nil {
		t.Errorf("per-key limits: %v", err)
	}
	if _, err := Parse([]byte("TargetName=" + strings.Repeat("n", 224) + "\x00")); !errors.Is(err, ErrTooLong) {
		t.Errorf("224-byte name: %v", err)
	}
	if _, err := Append(nil, Pair{"k", "a\x00b"}); !errors.Is(err, ErrSyntax) {
		t.Errorf("NUL in value: %v", err)
	}
}

func TestAccumulator(t *testing.T) {
	full, _ := Append(nil, Pair{"SendTargets", "All"}, Pair{"X-vendor.key", strings.Repeat("x", 200)})
	var a Accumulator
	chunks := Split(full, 16)
	for i, c := range chunks {
		done, err := a.Add(c, i < len(chunks)-1)
		if err != nil || done != (i == len(chunks)-1) {
			t.Fatalf("chunk %d: done %v err %v", i, done, err)
		}
	}
	ps, err := Parse(a.Take())
	if err != nil || len(ps) != 2 || ps[1].Value != strings.Repeat("x", 200) {
		t.Fatalf("%v %v", ps, err)
	}
	small := Accumulator{Max: 100}
	if _, err := small.Add(make([]byte, 60), true); err != nil {
		t.Fatal(err)
	}
	if _, err := small.Add(make([]byte, 60), false); !errors.Is(err, ErrTooLong) || small.Len() != 0 {
		t.Errorf("cap: %v, %d bytes kept", err, small.Len())
	}
}

func TestRespondRules(t *testing.T) {
	for _, c := range []struct {
		key, offer, ours, want string
		disc                   bool
	}{
		{"HeaderDigest", "CRC32C,None", "None,CRC32C", "CRC32C", false}, // offerer's order wins
		{"HeaderDigest", "None,CRC32C", "CRC32C", "CRC32C", false},
		{"HeaderDigest", "MD5", "None", Reject, false},
		{"InitialR2T", "No", "Yes", "Yes", false}, // OR
		{"InitialR2T", "No", "No", "No", false},
		{"ImmediateData", "Yes", "No", "No", false}, // AND
		{"DataPDUInOrder", "No", "Yes", "Yes", false},
		{"DataSequenceInOrder", "No", "No", "No", false},
		{"ImmediateData", "yes", "Yes", Reject, false},
		{"MaxBurstLength", "16776192", "262144", "262144", false}, // min
		{"FirstBurstLength", "4096", "65536", "4096", false},
		{"MaxConnections", "8", "1", "1", false},
		{"DefaultTime2Wait", "0", "2", "2", false}, // max
		{"DefaultTime2Retain", "0", "20", "0", false},
		{"MaxOutstandingR2T", "16", "1", "1", false},
		{"ErrorRecoveryLevel", "2", "0", "0", false},
		{"ErrorRecoveryLevel", "3", "0", Reject, false}, // out of range
		{"MaxBurstLength", "511", "262144", Reject, false},
		{"MaxBurstLength", "16777216", "262144", Reject, false},
		{"MaxBurstLength", "0x1000", "262144", "4096", false},
		{"MaxBurstLength", "Reject", "262144", Reject, false},
		{"MaxBurstLength", "262144", "262144", Irrelevant, true}, // discovery
		{"X-com.example.Foo", "1", "", NotUnderstood, false},
		{"Bogus", "1", "", NotUnderstood, false},
		{"OFMarkInt", "2048~8192", "", Irrelevant, false},
	} {
		a := Respond(Pair{c.key, c.offer}, c.ours, c.disc)
		if a.Value != c.want {
			t.Errorf("%s=%s vs %q: answered %q, want %q", c.key, c.offer, c.ours, a.Value, c.want)
		}
	}
	if a := Respond(Pair{"MaxRecvDataSegmentLength", "511"}, "", false); a.Outcome != Rejected {
		t.Errorf("MRDSL 511: %+v", a)
	}
	if a := Respond(Pair{"MaxRecvDataSegmentLength", "262144"}, "", false); a.Outcome != Declared || a.Value != "" {
		t.Errorf("MRDSL declared: %+v", a)
	}
	if a := Respond(Pair{"SessionType", "Bogus"}, "", false); a.Outcome != Rejected {
		t.Errorf("SessionType Bogus: %+v", a)
	}
}

func TestSettle(t *testing.T) {
	for _, c := range []struct {
		key, offered, answer, want string
		bad                        bool
	}{
		{"HeaderDigest", "None,CRC32C", "CRC32C", "CRC32C", false},
		{"HeaderDigest", "None", "CRC32C", "", true},
		{"ImmediateData", "No", "Yes", "", true},
		{"InitialR2T", "Yes", "No", "", true},
		{"MaxBurstLength", "262144", "1048576", "", true},
		{"DefaultTime2Wait", "2", "1", "", true},
		{"MaxBurstLength", "262144", "65536", "65536", false},
		{"MaxBurstLength", "262144", Reject, "262144", false}, // default
		{"Bogus", "1", NotUnderstood, "", false},
	} {
		got, err := Settle(c.key, c.offered, c.answer)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("Settle(%s %q %q) = %q, %v", c.key, c.offered, c.answer, got, err)
		}
	}
}

func TestFirstBurstNotAboveMaxBurst(t *testing.T) {
	p := Defaults()
	ans := Negotiate(&p, []Pair{{"MaxBurstLength", "4096"}, {"FirstBurstLength", "65536"}}, nil, false)
	if p.FirstBurstLength != 4096 || ans[1].Value != "4096" {
		t.Errorf("FirstBurstLength %d, answer %v", p.FirstBurstLength, ans)
	}
	// A rejected FirstBurstLength stays rejected (found by FuzzNegotiate:
	// the clamp used to turn "Reject" into a number the offerer never
	// offered).
	p = Defaults()
	ans = Negotiate(&p, []Pair{{"MaxBurstLength", "1000"}, {"FirstBurstLength", ""}}, nil, false)
	if ans[1].Value != Reject || p.FirstBurstLength != 1000 {
		t.Errorf("rejected FirstBurstLength: answer %v, param %d", ans, p.FirstBurstLength)
	}
	p.FirstBurstLength = 1 << 20
	if err := p.Check(); !errors.Is(err, ErrValue) {
		t.Errorf("Check: %v", err)
	}
}

func TestKeyTable(t *testing.T) {
	d := Defaults()
	want := Params{MaxConnections: 1, InitialR2T: true, ImmediateData: true, MaxRecvDataSegmentLength: 8192,
		PeerMaxRecvDataSegmentLength: 8192, MaxBurstLength: 262144, FirstBurstLength: 65536, DefaultTime2Wait: 2,
		DefaultTime2Retain: 20, MaxOutstandingR2T: 1, DataPDUInOrder: true, DataSequenceInOrder: true, SessionType: "Normal"}
	if d != want {
		t.Errorf("defaults\n got %+v\nwant %+v", d, want)
	}
	for name, k := range Keys {
		if k.Default != "" {
			if err := Validate(k, k.Default); err != nil {
				t.Errorf("%s default invalid: %v", name, err)
			}
		}
	}
}
