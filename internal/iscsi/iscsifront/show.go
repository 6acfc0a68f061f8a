package iscsifront

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/iscsi/target"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// Info is `vmsan iscsi show`: the iSCSI front end's configuration in
// force and its sessions (GET /v1/iscsi). No secret is included.
type Info struct {
	Enabled bool   `json:"enabled"`
	Mode    string `json:"mode,omitempty"`
	IQN     string `json:"iqn,omitempty"`
	// Portals are this node's listeners; PeerPortals the other node's of a
	// replicated pair (iscsi.peer_portals).
	Portals      []PortalInfo `json:"portals,omitempty"`
	PeerPortals  []PortalInfo `json:"peer_portals,omitempty"`
	PortalGroups []GroupInfo  `json:"portal_groups,omitempty"`
	// DiscoveryCHAPUser is the user discovery sessions must prove ("":
	// discovery without CHAP).
	DiscoveryCHAPUser   string               `json:"discovery_chap_user,omitempty"`
	AllowAny            bool                 `json:"allow_any"`
	DropRevokedSessions bool                 `json:"drop_revoked_sessions"`
	Targets             []TargetInfo         `json:"targets,omitempty"`
	Sessions            []target.SessionInfo `json:"sessions"`
}

// PortalInfo is one portal.
type PortalInfo struct {
	Addr         string `json:"addr"`
	PortalGroup  uint16 `json:"portal_group"`
	RelativePort uint16 `json:"relative_port"`
}

// GroupInfo is one target portal group: its tag and portals.
type GroupInfo struct {
	Tag     uint16   `json:"tag"`
	Peer    bool     `json:"peer,omitempty"` // the other node's group
	Portals []string `json:"portals"`
}

// TargetInfo is one target: LUNs, ACL, CHAP user names and what the
// access policy makes of them.
type TargetInfo struct {
	Name  string    `json:"name"`
	Alias string    `json:"alias,omitempty"`
	LUNs  []LUNInfo `json:"luns"`
	// Access: "acl", "chap", "acl+chap", "any" (allow_any) or "refused"
	// (no ACL, no CHAP, allow_any off: every login is refused).
	Access         string   `json:"access"`
	Initiators     []string `json:"initiators,omitempty"`
	CHAPUser       string   `json:"chap_user,omitempty"`
	MutualCHAPUser string   `json:"mutual_chap_user,omitempty"`
	Sessions       int      `json:"sessions"`
}

// LUNInfo maps a LUN to its volume.
type LUNInfo struct {
	LUN    uint64 `json:"lun"`
	Volume string `json:"volume"`
}

// Off is what `vmsan iscsi show` reports when the front end is off.
func Off() Info { return Info{Sessions: []target.SessionInfo{}} }

// Show describes the front end's configuration in force and its sessions.
func (f *FrontEnd) Show() Info {
	pol := f.pol.Load()
	in := Info{Enabled: true, Mode: f.cfg.ModeOrDefault(), IQN: f.iqn, AllowAny: pol.allowAny,
		DropRevokedSessions: pol.dropRevoked, Sessions: f.srv.Sessions()}
	if pol.discovery != nil {
		in.DiscoveryCHAPUser = pol.discovery.User
	}
	groups := map[uint16]*GroupInfo{}
	var order []uint16
	group := func(tag uint16, peer bool, addr string) {
		g := groups[tag]
		if g == nil {
			g = &GroupInfo{Tag: tag, Peer: peer}
			groups[tag] = g
			order = append(order, tag)
		}
		g.Portals = append(g.Portals, addr)
	}
	for i, ln := range f.lns {
		p := PortalInfo{Addr: ln.Addr().String(), PortalGroup: f.tags[i], RelativePort: f.rels[i]}
		in.Portals = append(in.Portals, p)
		group(p.PortalGroup, false, p.Addr)
	}
	for _, pp := range f.cfg.PeerPortals {
		p := PortalInfo{Addr: pp.Addr, PortalGroup: pp.Tag(), RelativePort: pp.RelativePort}
		in.PeerPortals = append(in.PeerPortals, p)
		group(p.PortalGroup, true, p.Addr)
	}
	for _, tag := range order {
		in.PortalGroups = append(in.PortalGroups, *groups[tag])
	}
	perTarget := map[string]int{}
	for _, s := range in.Sessions {
		if !s.Discovery {
			perTarget[s.Target]++
		}
	}
	for _, t := range f.Targets() {
		ti := TargetInfo{Name: t.Name, Alias: t.Alias, Initiators: t.Initiators, Access: accessOf(t),
			Sessions: perTarget[t.Name], LUNs: []LUNInfo{}}
		if t.Auth != nil {
			ti.CHAPUser, ti.MutualCHAPUser = t.Auth.User, t.Auth.MutualUser
		}
		if in.Mode == config.ISCSIModeNode {
			for _, l := range f.luns.get() {
				ti.LUNs = append(ti.LUNs, LUNInfo{LUN: l.Number, Volume: l.Volume})
			}
		} else {
			for _, v := range t.Volumes {
				ti.LUNs = append(ti.LUNs, LUNInfo{LUN: 0, Volume: v})
			}
		}
		in.Targets = append(in.Targets, ti)
	}
	return in
}

func accessOf(t target.Target) string {
	switch {
	case len(t.Initiators) > 0 && t.Auth != nil:
		return "acl+chap"
	case len(t.Initiators) > 0:
		return "acl"
	case t.Auth != nil:
		return "chap"
	case t.AllowAny:
		return "any"
	}
	return "refused"
}

// Print writes Info as text (`vmsan iscsi show`).
func Print(w io.Writer, in Info) {
	if !in.Enabled {
		fmt.Fprintln(w, "iSCSI is off (no iscsi.listen / --iscsi-listen)")
		return
	}
	disc := "none"
	if in.DiscoveryCHAPUser != "" {
		disc = "CHAP user " + in.DiscoveryCHAPUser
	}
	fmt.Fprintf(w, "node %s, mode %s, discovery auth: %s, allow_any: %v, drop_revoked_sessions: %v\n",
		in.IQN, in.Mode, disc, in.AllowAny, in.DropRevokedSessions)
	fmt.Fprintln(w, "\nportal groups:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TPGT\tNODE\tPORTALS")
	for _, g := range in.PortalGroups {
		node := "this"
		if g.Peer {
			node = "peer"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\n", g.Tag, node, strings.Join(g.Portals, " "))
	}
	tw.Flush()
	fmt.Fprintln(w, "\ntargets:")
	for _, t := range in.Targets {
		alias := ""
		if t.Alias != "" {
			alias = " (alias " + t.Alias + ")"
		}
		fmt.Fprintf(w, "  %s%s: access %s, %d session(s)\n", t.Name, alias, t.Access, t.Sessions)
		if t.CHAPUser != "" {
			mut := ""
			if t.MutualCHAPUser != "" {
				mut = ", mutual user " + t.MutualCHAPUser
			}
			fmt.Fprintf(w, "    CHAP user %s%s\n", t.CHAPUser, mut)
		}
		if len(t.Initiators) > 0 {
			fmt.Fprintf(w, "    ACL: %s\n", strings.Join(t.Initiators, " "))
		}
		luns := append([]LUNInfo(nil), t.LUNs...)
		sort.Slice(luns, func(i, j int) bool { return luns[i].LUN < luns[j].LUN })
		for _, l := range luns {
			fmt.Fprintf(w, "    LUN %d -> %s\n", l.LUN, l.Volume)
		}
	}
	fmt.Fprintln(w, "\nsessions:")
	if len(in.Sessions) == 0 {
		fmt.Fprintln(w, "  none")
		return
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  INITIATOR\tISID\tTSIH\tTARGET\tPORTAL\tTPGT\tREMOTE\tCONNS\tAUTH\tDIGESTS(H/D)\tMAXRECV(I/T)\tMAXBURST\tFIRSTBURST\tIMMEDIATE\tINITIALR2T\tIN-FLIGHT")
	for _, s := range in.Sessions {
		tg := s.Target
		if s.Discovery {
			tg = "(discovery)"
		}
		auth := s.Auth
		if s.CHAPUser != "" {
			auth += ":" + s.CHAPUser
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s/%s\t%d/%d\t%d\t%d\t%s\t%s\t%d\n",
			s.Initiator, s.ISID, s.TSIH, tg, s.Portal, s.PortalGroup, s.Remote, s.Connections, auth,
			s.HeaderDigest, s.DataDigest, s.InitiatorMaxRecvDataSegmentLength, s.TargetMaxRecvDataSegmentLength,
			s.MaxBurstLength, s.FirstBurstLength, yesNo(s.ImmediateData), yesNo(s.InitialR2T), s.CommandsInFlight)
	}
	tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "Yes"
	}
	return "No"
}

// PrintStats writes the iSCSI front end's counters (status text).
// Detail arrives decoded from JSON (map[string]any): re-decode it.
func PrintStats(w io.Writer, fes []volrt.FrontEndStats) {
	for _, fe := range fes {
		if fe.Name != "iscsi" {
			continue
		}
		var st target.Stats
		if b, err := json.Marshal(fe.Detail); err != nil || json.Unmarshal(b, &st) != nil {
			continue
		}
		fmt.Fprintf(w, "\niscsi (%s): %d sessions, %d connections open, %d accepted\n", strings.Join(fe.Listeners, " "), st.Sessions, st.ActiveConns, st.Accepted)
		fmt.Fprintf(w, "  logins %d, login failures %d", st.Logins, st.LoginFailures)
		if len(st.LoginFailureReasons) > 0 {
			keys := make([]string, 0, len(st.LoginFailureReasons))
			for k := range st.LoginFailureReasons {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			parts := make([]string, 0, len(keys))
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s %d", k, st.LoginFailureReasons[k]))
			}
			fmt.Fprintf(w, " (%s)", strings.Join(parts, ", "))
		}
		fmt.Fprintf(w, ", sessions refused (max_sessions) %d, reinstated %d, NOP timeouts %d\n", st.SessionsRefused, st.Reinstated, st.NopTimeouts)
		fmt.Fprintf(w, "  commands %d, check conditions %d, rejects %d, busy/task set full %d, read %s, written %s\n",
			st.Commands, st.CheckStatus, st.Rejects, st.BudgetRefused,
			volume.HumanSize(int64(st.BytesRead)), volume.HumanSize(int64(st.BytesWritten)))
	}
}
