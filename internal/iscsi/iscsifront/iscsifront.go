// Package iscsifront is the iSCSI front end: the policy between the
// daemon's volumes and the iSCSI session layer (iscsi/target) and the
// SCSI logical units (scsi): node or per-volume targets, stable LUN
// numbers, CHAP and ACLs from the configuration (reloadable), ALUA port
// group states from volumes' replication roles, capacity change
// notifications. It is built against frontend.Host and imports no daemon.
package iscsifront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/iscsi/target"
	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/scsi"
	"github.com/vmsan/vmsan/internal/volrt"
)

// FrontEnd serves the volumes over iSCSI (package iscsi/target for
// sessions, package scsi for the logical units). Off unless the config
// has an iscsi.listen entry (or serve got --iscsi-listen).
//
// Modes: "node" is one target (the node's IQN) with every volume a LUN;
// "per-volume" is one target per volume (IQN:VOLUME) with the volume as
// LUN 0, each with its own scsi.Target.
type FrontEnd struct {
	h        frontend.Host
	log      *slog.Logger
	cfg      config.ISCSI
	iqn      string
	srv      *target.Server
	lns      []net.Listener
	tags     []uint16
	rels     []uint16 // relative target port ids, by listener
	peer     []scsi.Port
	scsiIDs  map[string]string // volume -> configured scsi_id
	sessions *volrt.Sessions
	luns     *lunMap
	holds    *holdRegistry // the registry the SCSI layer opens volumes through

	// pol is the access policy (CHAP, ACLs, allow_any): read at every
	// login and discovery, replaced by a reload (reloadPolicy).
	pol atomic.Pointer[iscsiPolicy]

	stop     chan struct{} // ends watchCapacity
	stopOnce sync.Once

	mu        sync.Mutex
	node      *scsi.Target            // mode node
	perVolume map[string]*scsi.Target // mode per-volume, created on first use
	closeOnce sync.Once
}

// Vendor and Product are the INQUIRY identity every LUN reports (what a
// host's multipath.conf matches; `vmsan iscsi multipath-conf` prints them).
const (
	Vendor  = scsi.DefaultVendor
	Product = scsi.DefaultProduct
)

// lunFileName is the file in a volume's state directory that keeps its
// LUN number in node mode.
const lunFileName = "iscsi-lun"

// iscsiMaxTransfer is the largest READ/WRITE the iSCSI LUNs accept (the
// Block Limits VPD page's MAXIMUM TRANSFER LENGTH) and the session layer's
// per-command bound: 32 MiB, what Linux's sd and libiscsi's suite issue
// at most (its WRITE SAME tests write 65536 blocks in one WRITE(16)). A
// session's in-flight data stays bounded by target.Config.SessionBudget,
// and all of them by the daemon's inflight_budget (config.MinInflightBudget
// keeps that at least this large).
const iscsiMaxTransfer = 32 << 20

func chapFrom(a *config.ISCSIAuth) (*target.CHAP, error) {
	if a == nil {
		return nil, nil
	}
	sec, mut, err := a.Secrets()
	if err != nil {
		return nil, fmt.Errorf("iscsi CHAP secret: %w", err)
	}
	if len(sec) < 12 || mut != "" && len(mut) < 12 {
		return nil, errors.New("iscsi CHAP secret: want at least 12 bytes (RFC 7143 12.1.3)")
	}
	c := &target.CHAP{User: a.User, Secret: []byte(sec), MutualUser: a.MutualUser}
	if mut != "" {
		c.MutualSecret = []byte(mut)
	}
	return c, nil
}

// iscsiPolicy is who may log in: CHAP credentials and ACLs, node-wide
// and per volume (per-volume mode), and allow_any.
type iscsiPolicy struct {
	discovery   *target.CHAP
	auth        *target.CHAP
	initiators  []string
	perAuth     map[string]*target.CHAP // per-volume overrides
	perACL      map[string][]string
	allowAny    bool
	dropRevoked bool
}

// buildPolicy reads the access settings (and CHAP secret files) of ic.
func buildPolicy(ic config.ISCSI) (*iscsiPolicy, error) {
	p := &iscsiPolicy{perAuth: map[string]*target.CHAP{}, perACL: map[string][]string{},
		initiators: ic.Initiators, allowAny: ic.AllowAny, dropRevoked: ic.DropRevokedSessions}
	var err error
	if p.discovery, err = chapFrom(ic.DiscoveryAuth); err != nil {
		return nil, fmt.Errorf("iscsi.discovery_auth: %w", err)
	}
	if p.auth, err = chapFrom(ic.Auth); err != nil {
		return nil, fmt.Errorf("iscsi.auth: %w", err)
	}
	for _, t := range ic.Targets {
		if t.Auth != nil {
			if p.perAuth[t.Volume], err = chapFrom(t.Auth); err != nil {
				return nil, fmt.Errorf("iscsi.targets[%s].auth: %w", t.Volume, err)
			}
		}
		if len(t.Initiators) > 0 {
			p.perACL[t.Volume] = t.Initiators
		}
	}
	return p, nil
}

// forVolume is the CHAP and ACL of a per-volume target.
func (p *iscsiPolicy) forVolume(vol string) (*target.CHAP, []string) {
	auth, acl := p.auth, p.initiators
	if a := p.perAuth[vol]; a != nil {
		auth = a
	}
	if l := p.perACL[vol]; l != nil {
		acl = l
	}
	return auth, acl
}

// changes names the settings that differ between p and q (secrets
// compared by value, so a rewritten secret_file counts).
func (p *iscsiPolicy) changes(q *iscsiPolicy) []string {
	var out []string
	if !sameCHAP(p.discovery, q.discovery) {
		out = append(out, "iscsi.discovery_auth")
	}
	if !sameCHAP(p.auth, q.auth) {
		out = append(out, "iscsi.auth")
	}
	if !slices.Equal(p.initiators, q.initiators) {
		out = append(out, "iscsi.initiators")
	}
	if p.allowAny != q.allowAny {
		out = append(out, "iscsi.allow_any")
	}
	if p.dropRevoked != q.dropRevoked {
		out = append(out, "iscsi.drop_revoked_sessions")
	}
	vols := map[string]bool{}
	for v := range p.perAuth {
		vols[v] = true
	}
	for v := range q.perAuth {
		vols[v] = true
	}
	for v := range p.perACL {
		vols[v] = true
	}
	for v := range q.perACL {
		vols[v] = true
	}
	names := make([]string, 0, len(vols))
	for v := range vols {
		names = append(names, v)
	}
	sort.Strings(names)
	for _, v := range names {
		if !sameCHAP(p.perAuth[v], q.perAuth[v]) {
			out = append(out, "iscsi.targets["+v+"].auth")
		}
		if !slices.Equal(p.perACL[v], q.perACL[v]) {
			out = append(out, "iscsi.targets["+v+"].initiators")
		}
	}
	return out
}

func sameCHAP(a, b *target.CHAP) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.User == b.User && string(a.Secret) == string(b.Secret) &&
		a.MutualUser == b.MutualUser && string(a.MutualSecret) == string(b.MutualSecret)
}

// New builds the iSCSI front end over h with the iscsi section ic and
// binds its portals; it returns nil, nil when ic has no portal (iSCSI off).
// Nothing is served until Serve.
func New(h frontend.Host, ic config.ISCSI) (*FrontEnd, error) {
	if !ic.Enabled() {
		return nil, nil
	}
	f := &FrontEnd{h: h, log: h.Logger(), cfg: ic, iqn: ic.TargetName(), sessions: h.NewSessions("iscsi"), stop: make(chan struct{}),
		perVolume: map[string]*scsi.Target{}}
	f.luns = &lunMap{h: h, byVol: map[string]uint64{}}
	f.scsiIDs = ic.SCSIIDs()
	for _, p := range ic.PeerPortals {
		f.peer = append(f.peer, scsi.Port{Relative: p.RelativePort, Group: p.Tag()})
	}
	f.holds = &holdRegistry{Registry: h.Registry(), host: h, n: map[*volrt.Volume]int64{},
		followRoles: ic.ModeOrDefault() != config.ISCSIModeNode}
	if w := nopWarning(time.Duration(ic.NopInterval), time.Duration(ic.NopTimeout)); w != "" {
		f.log.Warn("iscsi: " + w)
	}
	pol, err := buildPolicy(ic)
	if err != nil {
		return nil, err
	}
	f.pol.Store(pol)
	f.srv = target.New(target.Config{
		Targets:       f.Targets,
		DiscoveryAuth: pol.discovery,
		QueueDepth:    ic.QueueDepth,
		MaxTransfer:   iscsiMaxTransfer,
		Budget:        h.Budget(),
		MaxSessions:   ic.MaxSessions,
		NopInterval:   time.Duration(ic.NopInterval),
		NopTimeout:    time.Duration(ic.NopTimeout),
		LoginTimeout:  time.Duration(ic.LoginTimeout),
		// Connections still logging in are not the data path: they get
		// at most an eighth of the descriptors (pendingLogins).
		MaxPendingLogins: pendingLogins(ic.MaxPendingLogins),
		DataOutTimeout:   time.Duration(ic.DataOutTimeout),
		Logger:           f.log,
		Sessions:         f.sessions,
		Portals:          f.portals,
	})
	for _, p := range ic.Portals() {
		ln, err := net.Listen("tcp", p.Addr)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("iscsi listen %s: %w", p.Addr, err)
		}
		f.lns = append(f.lns, ln)
		f.tags = append(f.tags, p.Tag())
		f.rels = append(f.rels, p.Rel(len(f.rels)))
	}
	if ic.ModeOrDefault() == config.ISCSIModeNode {
		f.node = f.newSCSI(f.luns.get, "")
	}
	f.warnAccess(pol)
	return f, nil
}

// pendingLogins is the cap on connections still logging in: configured
// (64 when 0), bounded by an eighth of the file descriptor limit (at
// least 4), so a flood of half-open logins runs into its own cap, never
// into EMFILE for a client.
func pendingLogins(configured int) int {
	v := configured
	if v <= 0 {
		v = 64
	}
	return netutil.Share(v, netutil.NofileLimit(), 8, 4)
}

// warnAccess warns at start-up about portals open to any initiator on the
// network, and about a configuration that lets no one in.
func (f *FrontEnd) warnAccess(p *iscsiPolicy) {
	var exposed []string
	for _, ln := range f.lns {
		if networkReachable(ln.Addr()) {
			exposed = append(exposed, ln.Addr().String())
		}
	}
	nodeOpen := p.auth == nil && len(p.initiators) == 0
	perVolume := f.cfg.ModeOrDefault() == config.ISCSIModePerVolume
	overrides := perVolume && (len(p.perAuth) > 0 || len(p.perACL) > 0)
	switch {
	case nodeOpen && p.allowAny && len(exposed) > 0:
		f.log.Warn("iscsi: portals reachable from the network accept any initiator without CHAP or an ACL (iscsi.allow_any): anyone who reaches them can read and write the volumes",
			"portals", exposed)
	case nodeOpen && !p.allowAny && !overrides:
		f.log.Warn("iscsi: no CHAP (iscsi.auth) and no ACL (iscsi.initiators) configured: every login is refused; set one, or iscsi.allow_any: true to let any initiator in")
	}
}

// networkReachable says a listener accepts connections from other hosts
// (a TCP address that is not loopback).
func networkReachable(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && !ta.IP.IsLoopback()
}

// reloadPolicy applies the access settings of next (CHAP users, ACLs,
// allow_any, drop_revoked_sessions) to logins from now on and returns
// the keys that changed. With drop_revoked_sessions it also closes the
// sessions whose initiator lost access; otherwise they keep going.
// REQUIRES: p was built from next (buildPolicy) before the reload changed
// anything.
func (f *FrontEnd) reloadPolicy(p *iscsiPolicy) []string {
	old := f.pol.Load()
	changed := old.changes(p)
	if len(changed) == 0 {
		return nil
	}
	f.pol.Store(p)
	f.srv.SetDiscoveryAuth(p.discovery)
	for _, k := range changed {
		f.log.Info("iscsi: access setting changed; new logins use it", "key", k)
	}
	if p.dropRevoked {
		for _, r := range f.srv.DropRevoked() {
			f.log.Info("iscsi: session dropped after the reload", "initiator", r.Session.Initiator, "target", r.Session.Target, "why", r.Why)
		}
	} else if len(changed) > 0 {
		f.log.Info("iscsi: open sessions keep going under the access they logged in with (iscsi.drop_revoked_sessions: true closes those that lost it)")
	}
	return changed
}

// newSCSI builds the SCSI layer over the daemon's volumes; vol names the
// one volume of a per-volume target ("" in node mode), whose replication
// role decides its ALUA states (VolumeRoleChanged).
func (f *FrontEnd) newSCSI(luns func() []scsi.LUN, vol string) *scsi.Target {
	ports := f.ports
	if vol != "" {
		ports = func() []scsi.Port { return f.volumePorts(vol) }
	}
	return scsi.New(scsi.Config{
		Registry:    idRegistry{f.holds, f.scsiIDs},
		LUNs:        luns,
		StateDir:    f.h.StateDir,
		MaxTransfer: iscsiMaxTransfer,
		Ports:       ports,
		Abort:       f.srv.AbortNexus,
	})
}

// ports are this node's target ports (config order; relative port ids
// from the config, default the position from 1).
func (f *FrontEnd) ports() []scsi.Port {
	out := make([]scsi.Port, len(f.tags))
	for i, t := range f.tags {
		out[i] = scsi.Port{Relative: f.rels[i], Group: t}
	}
	return out
}

// volumePorts are a per-volume target's ports: this node's, and for a
// replicated volume the peer's too (iscsi.peer_portals), so that REPORT
// TARGET PORT GROUPS describes both nodes' paths to the one logical unit.
func (f *FrontEnd) volumePorts(vol string) []scsi.Port {
	out := f.ports()
	if f.h.VolumeRole(vol) != role.Standalone {
		out = append(out, f.peer...)
	}
	return out
}

// portals is what SendTargets advertises: every listener in config order
// (Serve goroutines register in no particular order).
func (f *FrontEnd) portals() []target.Portal {
	out := make([]target.Portal, len(f.lns))
	for i, ln := range f.lns {
		out[i] = target.Portal{Addr: ln.Addr().String(), Tag: f.tags[i]}
	}
	return out
}

// VolumeRoleChanged applies a replicated volume's role to its target's
// port groups (frontend.RoleObserver). Node mode has one target for every volume
// and cannot give volumes different states: roles apply to per-volume
// targets only (config refuses peer_portals in node mode).
func (f *FrontEnd) VolumeRoleChanged(name string, r role.Role) {
	f.mu.Lock()
	t := f.perVolume[name]
	f.mu.Unlock()
	if t != nil {
		f.applyRole(t, r)
	}
}

// DrainVolume waits for the commands the volume's per-volume logical unit
// admitted past its ALUA check (frontend.RoleDrainer). Node mode presents no roles,
// and its opens count as clients that block a demote (holdRegistry).
func (f *FrontEnd) DrainVolume(name string, timeout time.Duration) error {
	f.mu.Lock()
	t := f.perVolume[name]
	f.mu.Unlock()
	if t == nil {
		return nil
	}
	return t.WaitAdmitted(timeout)
}

// applyRole sets the ALUA states of this node's and the peer's groups:
//
//	role          this node's groups     peer's groups
//	standalone    active/optimized       (not listed)
//	primary       active/optimized       standby
//	secondary     standby                active/optimized
//	changing      transitioning          unchanged
//
// Every change raises ASYMMETRIC ACCESS STATE CHANGED (2A/06) on every
// I_T nexus, which makes Linux's scsi_dh_alua re-read the states.
func (f *FrontEnd) applyRole(t *scsi.Target, r role.Role) {
	own, peer := scsi.ALUAActiveOptimized, scsi.ALUAStandby
	setPeer := len(f.peer) > 0
	switch r {
	case role.Standalone:
		setPeer = false
	case role.Secondary:
		own, peer = scsi.ALUAStandby, scsi.ALUAActiveOptimized
	case role.Transitioning:
		own, setPeer = scsi.ALUATransitioning, false
	}
	for _, g := range uniqueGroups(f.ports()) {
		t.SetPortGroupState(g, own)
	}
	if setPeer {
		for _, g := range uniqueGroups(f.peer) {
			t.SetPortGroupState(g, peer)
		}
	}
}

func uniqueGroups(ps []scsi.Port) []uint16 {
	var out []uint16
	seen := map[uint16]bool{}
	for _, p := range ps {
		if !seen[p.Group] {
			seen[p.Group] = true
			out = append(out, p.Group)
		}
	}
	return out
}

// idRegistry gives volumes with a configured scsi_id that UUID in their
// export.Info, from which package scsi derives the logical unit's NAA
// designator and serial number: both replicas of a pair then identify as
// one logical unit (their volume UUIDs differ).
type idRegistry struct {
	export.Registry
	ids map[string]string
}

func (r idRegistry) Open(name string) (export.Device, error) {
	dev, err := r.Registry.Open(name)
	if err != nil {
		return nil, err
	}
	if id, ok := r.ids[dev.Info().Name]; ok {
		return idDevice{dev, id}, nil
	}
	return dev, nil
}

type idDevice struct {
	export.Device
	id string
}

func (d idDevice) Info() export.Info {
	i := d.Device.Info()
	i.UUID = d.id
	return i
}

// volumeNames returns the open volumes, sorted.
func (f *FrontEnd) volumeNames() []string {
	vols := *f.h.Volumes()
	out := make([]string, 0, len(vols))
	for n := range vols {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Targets is target.Config.Targets: read at each login and discovery.
func (f *FrontEnd) Targets() []target.Target {
	names := f.volumeNames()
	pol := f.pol.Load()
	if f.cfg.ModeOrDefault() == config.ISCSIModeNode {
		return []target.Target{{Name: f.iqn, Alias: "vmsan", LUs: f.node, Auth: pol.auth,
			Initiators: pol.initiators, AllowAny: pol.allowAny, Volumes: names}}
	}
	out := make([]target.Target, 0, len(names))
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range names {
		lus := f.perVolume[n]
		if lus == nil {
			vol := n
			one := []scsi.LUN{{Number: 0, Volume: vol}}
			lus = f.newSCSI(func() []scsi.LUN { return one }, vol)
			if r := f.h.VolumeRole(vol); r != role.Standalone {
				f.applyRole(lus, r)
			}
			f.perVolume[n] = lus
		}
		auth, acl := pol.forVolume(n)
		out = append(out, target.Target{Name: f.iqn + ":" + iqnVolume(n), Alias: n, LUs: lus,
			Auth: auth, Initiators: acl, AllowAny: pol.allowAny, Volumes: []string{n}})
	}
	return out
}

// iqnVolume lowercases a volume name for an IQN (IQNs are lower case;
// volume names are [A-Za-z0-9._-]).
func iqnVolume(n string) string { return strings.ToLower(n) }

func (f *FrontEnd) Name() string { return "iscsi" }

// IdleHolds implements frontend.IdleHolder: the references the SCSI layer's
// logical units hold on vol while no iSCSI session uses it. A logical
// unit keeps its volume open between sessions (reservations and unit
// attentions live there); that is not a connected client, so deleting the
// volume needs no --force. A command that comes later finds the LUN gone.
func (f *FrontEnd) IdleHolds(vol string) int64 {
	if f.sessions.PerVolume()[vol] > 0 {
		return 0
	}
	return f.holds.count(vol)
}

// ReleaseIdle implements frontend.IdleHolder: the logical units on vol close
// (their volume hold with them) when no session uses the volume.
func (f *FrontEnd) ReleaseIdle(vol string) {
	if f.sessions.PerVolume()[vol] > 0 {
		return
	}
	f.mu.Lock()
	ts := []*scsi.Target{f.node, f.perVolume[vol]}
	f.mu.Unlock()
	for _, t := range ts {
		if t != nil {
			t.ReleaseVolume(vol)
		}
	}
}

// holdRegistry counts the devices the SCSI layer holds per volume
// instance (not per name: a logical unit may still hold a deleted volume
// when a new one of the same name appears, and that hold is not the new
// volume's).
type holdRegistry struct {
	export.Registry
	host frontend.Host
	mu   sync.Mutex
	n    map[*volrt.Volume]int64
	// followRoles: per-volume mode, where each logical unit follows its
	// volume's replication role (ALUA states, drained on a change): its
	// hold is then not a client that blocks a demote (export.RoleFollower).
	followRoles bool
}

func (h *holdRegistry) Open(name string) (export.Device, error) {
	v := (*h.host.Volumes())[name]
	dev, err := h.Registry.Open(name)
	if err != nil {
		return nil, err
	}
	if rf, ok := dev.(export.RoleFollower); ok && h.followRoles {
		rf.FollowRoles()
	}
	h.mu.Lock()
	h.n[v]++
	h.mu.Unlock()
	return &heldDevice{Device: dev, h: h, v: v}, nil
}

// count returns the holds on the volume now published under name.
func (h *holdRegistry) count(name string) int64 {
	v := (*h.host.Volumes())[name]
	if v == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[v]
}

type heldDevice struct {
	export.Device
	h    *holdRegistry
	v    *volrt.Volume
	once sync.Once
}

func (d *heldDevice) Release() {
	d.once.Do(func() {
		d.h.mu.Lock()
		if d.h.n[d.v]--; d.h.n[d.v] <= 0 {
			delete(d.h.n, d.v)
		}
		d.h.mu.Unlock()
		d.Device.Release()
	})
}

func (f *FrontEnd) Serve(ctx context.Context) error {
	go f.watchCapacity()
	errc := make(chan error, len(f.lns))
	for i, ln := range f.lns {
		go func(ln net.Listener, tag, rel uint16) {
			err := f.srv.ServePort(ln, tag, rel)
			if err != nil && !errors.Is(err, target.ErrServerClosed) {
				err = fmt.Errorf("iscsi listener %s: %w", ln.Addr(), err)
			} else {
				err = nil
			}
			errc <- err
		}(ln, f.tags[i], f.rels[i])
	}
	for range f.lns {
		if err := <-errc; err != nil {
			return err
		}
	}
	return nil
}

func (f *FrontEnd) Shutdown(ctx context.Context) error {
	f.stopOnce.Do(func() { close(f.stop) })
	err := f.srv.Shutdown(ctx)
	f.closeSCSI()
	if err != nil {
		return fmt.Errorf("iscsi shutdown: %w", err)
	}
	return nil
}

func (f *FrontEnd) closeSCSI() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.node != nil {
		f.node.Close()
	}
	for _, t := range f.perVolume {
		t.Close()
	}
}

func (f *FrontEnd) Close() {
	f.stopOnce.Do(func() { close(f.stop) })
	f.closeOnce.Do(func() {
		if f.srv != nil {
			f.srv.Close()
		}
		for _, ln := range f.lns {
			ln.Close()
		}
		f.closeSCSI()
	})
}

// watchCapacity tells logged-in initiators about online resizes with an
// Asynchronous Message (target.Server.NotifyCapacityChanged) by polling
// the open volumes' sizes every second: a resize is rare, a poll reads one
// atomic per volume, and no resize path has to know about iSCSI.
func (f *FrontEnd) watchCapacity() {
	last := map[string]int64{}
	for name, v := range *f.h.Volumes() {
		last[name] = v.Size() // sizes when serving starts
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-tick.C:
		}
		vols := *f.h.Volumes()
		for name, v := range vols {
			sz := v.Size()
			if old, seen := last[name]; seen && old != sz {
				f.notifyResize(name)
			}
			last[name] = sz
		}
		for name := range last {
			if _, ok := vols[name]; !ok {
				delete(last, name)
			}
		}
	}
}

func (f *FrontEnd) notifyResize(vol string) {
	if f.cfg.ModeOrDefault() == config.ISCSIModePerVolume {
		f.srv.NotifyCapacityChanged(f.iqn+":"+iqnVolume(vol), 0)
		return
	}
	for _, l := range f.luns.get() {
		if l.Volume == vol {
			f.srv.NotifyCapacityChanged(f.iqn, l.Number)
		}
	}
}

// Addrs are the bound portal addresses in configuration order.
func (f *FrontEnd) Addrs() []net.Addr { return netutil.Addrs(f.lns) }

func (f *FrontEnd) Stats() volrt.FrontEndStats {
	st := f.srv.Stats()
	fs := volrt.FrontEndStats{
		Name:         "iscsi",
		Accepted:     st.Accepted,
		Active:       st.ActiveConns,
		ErrorReplies: st.CheckStatus,
		BytesRead:    st.BytesRead,
		BytesWritten: st.BytesWritten,
		Requests:     st.Commands,
		Clients:      f.sessions.List(),
		Detail:       st,
		Refused:      st.SessionsRefused + st.PendingRefused,
	}
	fs.LoginFailures = make(map[string]uint64, len(target.LoginFailureReasons))
	for _, r := range target.LoginFailureReasons {
		fs.LoginFailures[r] = st.LoginFailureReasons[r]
	}
	for _, a := range f.Addrs() {
		fs.Listeners = append(fs.Listeners, a.String())
	}
	return fs
}

// BannerLines: discovery and QEMU attach lines on the first portal.
func (f *FrontEnd) BannerLines() []string {
	if len(f.lns) == 0 {
		return nil
	}
	a, ok := f.lns[0].Addr().(*net.TCPAddr)
	if !ok {
		return nil
	}
	host := a.IP.String()
	if a.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	hp := net.JoinHostPort(host, strconv.Itoa(a.Port))
	iqn, lun := f.iqn, "0"
	if exp := f.h.BannerExport(); exp != "" {
		if f.cfg.ModeOrDefault() == config.ISCSIModePerVolume {
			iqn = f.iqn + ":" + iqnVolume(exp)
		} else {
			for _, l := range f.luns.get() {
				if l.Volume == exp {
					lun = strconv.FormatUint(l.Number, 10)
				}
			}
		}
	}
	return []string{
		"",
		"iSCSI target " + iqn + " on " + hp + "; discover it with:",
		"  iscsiadm -m discovery -t sendtargets -p " + hp,
		"or use it from QEMU with:",
		fmt.Sprintf("  -drive file=iscsi://%s/%s/%s,format=raw,if=virtio,cache=none", hp, iqn, lun),
	}
}

// lunMap gives each volume a stable LUN number in node mode: the number
// is kept in the volume's state directory (file iscsi-lun), so it
// survives restarts and other volumes coming and going; a new volume takes
// the lowest free number. It is read on every SCSI command, so get is a
// pointer comparison unless the volume set changed.
type lunMap struct {
	h     frontend.Host
	mu    sync.Mutex
	snap  *frontend.Volumes // the volume snapshot cached is for
	cache []scsi.LUN
	byVol map[string]uint64
}

func (m *lunMap) get() []scsi.LUN {
	snap := m.h.Volumes()
	m.mu.Lock()
	defer m.mu.Unlock()
	if snap == m.snap {
		return m.cache
	}
	names := make([]string, 0, len(*snap))
	for n := range *snap {
		names = append(names, n)
	}
	sort.Strings(names)
	byVol := map[string]uint64{}
	used := map[uint64]bool{}
	var fresh []string
	for _, n := range names {
		num, ok := m.byVol[n]
		if !ok {
			num, ok = m.readLUN(n)
		}
		if !ok || used[num] {
			fresh = append(fresh, n)
			continue
		}
		byVol[n], used[num] = num, true
	}
	for _, n := range fresh {
		var num uint64
		for used[num] {
			num++
		}
		byVol[n], used[num] = num, true
		m.writeLUN(n, num)
	}
	out := make([]scsi.LUN, 0, len(byVol))
	for n, num := range byVol {
		out = append(out, scsi.LUN{Number: num, Volume: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Number < out[j].Number })
	m.snap, m.cache, m.byVol = snap, out, byVol
	return out
}

// maxLUN bounds persisted numbers to what flat addressing encodes.
const maxLUN = 16383

func (m *lunMap) readLUN(vol string) (uint64, bool) {
	dir, err := m.h.StateDir(vol)
	if err != nil {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(dir, lunFileName))
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n > maxLUN {
		return 0, false
	}
	return n, true
}

func (m *lunMap) writeLUN(vol string, n uint64) {
	dir, err := m.h.StateDir(vol)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, lunFileName), []byte(strconv.FormatUint(n, 10)+"\n"), 0o644)
	}
	if err != nil {
		m.h.Logger().Warn("iscsi: cannot persist the LUN number; it may change after a restart", "volume", vol, "lun", n, "err", err)
	}
}

// nopWarning explains why the NOP timers (0: default) may let a silent
// path's stale commands execute after an initiator failed them over, or
// returns "". The target cannot know the hosts' timers; it checks against
// those `vmsan iscsi multipath-conf` recommends.
func nopWarning(iv, to time.Duration) string {
	if iv == 0 {
		iv = target.DefaultNopInterval
	}
	if to <= 0 {
		to = target.DefaultNopTimeout
	}
	if iv < 0 {
		return "nop_interval is negative: silent connections are never closed, and commands a lost path delivers late execute even after the host resent them on another path"
	}
	if iv+to > target.SafeNopTotal {
		return fmt.Sprintf("nop_interval + nop_timeout = %v: above %v, a silent connection may outlive the host's failover (NOP-Out 1 s + 1 s, recovery 2 s as `vmsan iscsi multipath-conf` prints) and its late commands execute over newer writes; keep the sum below the host's noop_out_timeout + fast_io_fail_tmo - 0.5 s", iv+to, target.SafeNopTotal)
	}
	return ""
}

// PrepareReload implements frontend.Reloader: the access settings of
// next (CHAP users, ACLs, allow_any, drop_revoked_sessions) are read now,
// secret files included, and apply to logins from the call of apply on.
// Portals, the mode, identities and timers are read once in New.
func (f *FrontEnd) PrepareReload(next config.Config) (apply func(), err error) {
	pol, err := buildPolicy(next.ISCSI)
	if err != nil {
		return nil, err
	}
	return func() { f.reloadPolicy(pol) }, nil
}
