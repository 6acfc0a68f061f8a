package initiator

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vmsan/vmsan/internal/iscsi/pdu"
	"github.com/vmsan/vmsan/internal/iscsi/text"
)

// Portal is one TargetAddress of a SendTargets answer.
type Portal struct {
	Addr string // host:port
	Tag  uint16 // target portal group tag
}

// Target is one target a discovery session listed.
type Target struct {
	Name    string
	Portals []Portal
}

// maxTextSteps bounds the Text Request/Response exchanges of one
// SendTargets, and DefaultMaxTotal (package text) bounds its size.
const maxTextSteps = 64

// Discover opens a discovery session to addr (cfg.TargetName ignored;
// CHAP as configured), asks SendTargets=All and logs out.
func Discover(ctx context.Context, addr string, cfg Config) ([]Target, error) {
	c := cfg
	c.TargetName = ""
	s, err := dial(ctx, addr, &c, true)
	if err != nil {
		return nil, err
	}
	ts, err := s.SendTargets(ctx)
	lerr := s.Logout(ctx)
	if err != nil {
		return nil, err
	}
	return ts, lerr
}

// SendTargets runs a SendTargets=All text exchange (gathering continued
// responses) and parses the answer.
func (s *Session) SendTargets(ctx context.Context) ([]Target, error) {
	var acc text.Accumulator
	ttt := uint32(pdu.ReservedTag)
	req, _ := text.Append(nil, text.Pair{Key: "SendTargets", Value: "All"})
	for step := 0; ; step++ {
		if step == maxTextSteps {
			return nil, errors.New("iscsi: SendTargets answer never ended")
		}
		data := req
		tt := ttt
		h, ans, err := s.exchange(ctx, false, func(itt, cmdSN, expStat uint32) (pdu.PDU, []byte) {
			return &pdu.TextRequest{Final: true, LUN: 0, ITT: itt, TTT: tt, CmdSN: cmdSN, ExpStatSN: expStat}, data
		})
		if err != nil {
			return nil, err
		}
		resp := h.(*pdu.TextResponse)
		done, err := acc.Add(ans, resp.Continue)
		if err != nil {
			return nil, err
		}
		if done {
			break
		}
		// RFC 7143 11.11.4: continue with an empty request carrying the
		// target's TTT.
		ttt, req = resp.TTT, nil
	}
	pairs, err := text.ParseList(acc.Take())
	if err != nil {
		return nil, err
	}
	var out []Target
	for _, p := range pairs {
		switch p.Key {
		case "TargetName":
			out = append(out, Target{Name: p.Value})
		case "TargetAddress":
			if len(out) == 0 {
				return nil, errors.New("iscsi: TargetAddress before any TargetName")
			}
			addr, tag, _ := strings.Cut(p.Value, ",")
			pt := Portal{Addr: addr}
			if tag != "" {
				n, err := strconv.ParseUint(tag, 10, 16)
				if err != nil {
					return nil, fmt.Errorf("iscsi: TargetAddress %q: bad portal group tag", p.Value)
				}
				pt.Tag = uint16(n)
			}
			out[len(out)-1].Portals = append(out[len(out)-1].Portals, pt)
		}
	}
	return out, nil
}
