package doctor

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/vmsan/vmsan/internal/replset"
)

// ifUse is a network interface and why it matters (which listener or
// peer uses it).
type ifUse struct {
	iface Interface
	why   []string
}

// storageIfaces maps the client listeners, the replication listeners and
// the peers to interfaces. A wildcard listener uses every interface that
// is up; a peer uses the interface holding the source address the kernel
// picks for it (a route lookup). Loopback is left out: its MTU and speed
// are not a property of any network.
func (e *env) storageIfaces() ([]ifUse, []string) {
	if e.h.Interfaces == nil {
		return nil, []string{"interface list " + errNotAvailable.Error()}
	}
	ifs, err := e.h.Interfaces()
	if err != nil {
		return nil, []string{"interface list: " + err.Error()}
	}
	uses := map[string]*ifUse{}
	var order []string
	var notes []string
	add := func(i Interface, why string) {
		if i.Loopback {
			return
		}
		u := uses[i.Name]
		if u == nil {
			u = &ifUse{iface: i}
			uses[i.Name] = u
			order = append(order, i.Name)
		}
		if !contains(u.why, why) {
			u.why = append(u.why, why)
		}
	}
	byIP := func(ip net.IP, why string) bool {
		for _, i := range ifs {
			for _, a := range i.Addrs {
				if a.Equal(ip) {
					add(i, why)
					return true
				}
			}
		}
		return false
	}
	listen := func(addr, what string) {
		if addr == "" || strings.HasPrefix(addr, "unix:") {
			return
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s %q: %v", what, addr, err))
			return
		}
		why := what + " " + addr
		ip := net.ParseIP(host)
		if host == "" || (ip != nil && ip.IsUnspecified()) {
			for _, i := range ifs {
				if i.Up {
					add(i, why)
				}
			}
			return
		}
		if ip == nil {
			notes = append(notes, fmt.Sprintf("%s %q: not an IP address, not mapped to an interface", what, addr))
			return
		}
		if !ip.IsLoopback() && !byIP(ip, why) {
			notes = append(notes, fmt.Sprintf("%s %q: no interface has this address", what, addr))
		}
	}
	peer := func(addr string) {
		if e.h.SourceIP == nil {
			return
		}
		ip, err := e.h.SourceIP(addr)
		if err != nil {
			notes = append(notes, fmt.Sprintf("route to peer %s: %v", addr, err))
			return
		}
		if !ip.IsLoopback() && !byIP(ip, "peer "+addr) {
			notes = append(notes, fmt.Sprintf("peer %s: source address %s is on no interface", addr, ip))
		}
	}
	for _, a := range e.o.Listen {
		listen(a, "listen")
	}
	for _, rp := range e.repls {
		listen(rp.Listen, "repl listen")
		peer(rp.Peer)
	}
	if e.o.Peer != "" {
		peer(e.o.Peer)
	}
	out := make([]ifUse, 0, len(order))
	for _, n := range order {
		out = append(out, *uses[n])
	}
	return out, notes
}

// linkSpeed is the interface speed in Mb/s from sysfs (0: unknown, as for
// most virtual interfaces, which report -1).
func (e *env) linkSpeed(name string) int64 {
	s, err := e.h.readFile("/sys/class/net/" + name + "/speed")
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// jumboMTU: a 1 MiB replicated write is ~120 frames at 9000 bytes and
// ~720 at 1500; per-packet cost is what limits a host's storage traffic.
const jumboMTU = 9000

func (e *env) netChecks() []Result {
	uses, notes := e.storageIfaces()
	var rs []Result
	if len(uses) == 0 {
		r := Result{Check: "net.mtu", Status: OK, Evidence: "no listener or peer on a non-loopback interface"}
		if len(notes) > 0 {
			r.Status = Warn
			r.Evidence += "; " + strings.Join(notes, "; ")
			r.Fix = "check the listen and peer addresses in the configuration"
		}
		rs = append(rs, r)
	}
	for _, u := range uses {
		r := Result{Check: "net.mtu", Subject: u.iface.Name, Status: OK,
			Evidence: fmt.Sprintf("mtu %d", u.iface.MTU)}
		if sp := e.linkSpeed(u.iface.Name); sp > 0 {
			r.Evidence += fmt.Sprintf(", %d Mb/s", sp)
		}
		if !u.iface.Up {
			r.Evidence += ", DOWN"
		}
		r.Evidence += "; used by " + strings.Join(u.why, ", ")
		if len(notes) > 0 {
			r.Evidence += "; " + strings.Join(notes, "; ")
		}
		if !u.iface.Up {
			r.Status = Fail
			r.Fix = "ip link set dev " + u.iface.Name + " up"
		} else if u.iface.MTU < jumboMTU {
			r.Status = Warn
			r.Evidence += "; storage traffic in standard frames costs ~6× the packets of jumbo frames"
			r.Fix = fmt.Sprintf("on a dedicated storage network: ip link set dev %s mtu 9000 and persist it in the network configuration; every switch port and the peer must carry 9000-byte frames too, or large packets are silently dropped", u.iface.Name)
		}
		rs = append(rs, r)
	}
	rs = append(rs, e.tcpBufCheck(uses))
	return rs
}

// minTCPBuf is the least autotuning ceiling worth having on a storage
// host: 4 MiB covers a 10 Gb/s link at 3 ms or a 1 Gb/s link at 30 ms.
const minTCPBuf = 4 << 20

func (e *env) tcpBufCheck(uses []ifUse) Result {
	r := Result{Check: "net.tcp_buffers", Status: OK}
	read3 := func(p string) (int64, string, error) {
		s, err := e.h.readFile(p)
		if err != nil {
			return 0, "", err
		}
		f := strings.Fields(s)
		if len(f) != 3 {
			return 0, s, fmt.Errorf("%s: want 3 numbers, got %q", p, s)
		}
		n, err := strconv.ParseInt(f[2], 10, 64)
		return n, strings.Join(f, " "), err
	}
	rmax, rs, err1 := read3("/proc/sys/net/ipv4/tcp_rmem")
	wmax, ws, err2 := read3("/proc/sys/net/ipv4/tcp_wmem")
	if err1 != nil || err2 != nil {
		err := err1
		if err == nil {
			err = err2
		}
		return unreadable(r.Check, "", err)
	}
	r.Evidence = fmt.Sprintf("tcp_rmem %q, tcp_wmem %q", rs, ws)
	for _, k := range []string{"rmem_max", "wmem_max"} {
		if s, err := e.h.readFile("/proc/sys/net/core/" + k); err == nil {
			r.Evidence += fmt.Sprintf(", %s %s", k, s)
		}
	}
	need := int64(minTCPBuf)
	why := "4 MiB minimum for a storage host"
	if rtt, ok := e.peerRTT(); ok {
		var speed int64
		for _, u := range uses {
			for _, w := range u.why {
				if strings.HasPrefix(w, "peer ") {
					speed = max(speed, e.linkSpeed(u.iface.Name))
				}
			}
		}
		if speed > 0 {
			bdp := int64(float64(speed) * 1e6 / 8 * rtt.Seconds())
			if 2*bdp > need {
				need = 2 * bdp
				why = fmt.Sprintf("2 × bandwidth-delay product of %d Mb/s × %v", speed, rtt.Round(time.Microsecond))
			}
		}
	}
	if rmax >= need && wmax >= need {
		return r
	}
	r.Status = Warn
	r.Evidence += fmt.Sprintf("; autotuning ceiling %s/%s below %s (%s): a replication or client stream cannot fill the link", human(rmax), human(wmax), human(need), why)
	v := max(int64(16<<20), need)
	r.Fix = fmt.Sprintf(`sysctl -w net.ipv4.tcp_rmem="4096 131072 %d" net.ipv4.tcp_wmem="4096 65536 %d" net.core.rmem_max=%d net.core.wmem_max=%d; persist the same keys in /etc/sysctl.d/90-vmsan.conf`, v, v, v, v)
	return r
}

// probe is the measured connect times to Options.Peer.
type probe struct {
	done  bool
	times []time.Duration
	err   error
}

// peerRTT returns the median TCP connect time to the peer, measured once.
func (e *env) peerRTT() (time.Duration, bool) {
	p := e.measure()
	if len(p.times) == 0 {
		return 0, false
	}
	return p.times[len(p.times)/2], true
}

func (e *env) measure() *probe {
	if e.peerProbe.done || e.o.Peer == "" || e.h.Connect == nil {
		e.peerProbe.done = true
		return &e.peerProbe
	}
	e.peerProbe.done = true
	pt, _ := e.replFor(e.o.Peer)
	timeout := min(pt.PingTimeout, 3*time.Second)
	for i := 0; i < e.o.Probes; i++ {
		d, err := e.h.Connect(e.o.Peer, timeout)
		if err != nil {
			e.peerProbe.err = err
			continue
		}
		e.peerProbe.times = append(e.peerProbe.times, d)
	}
	sort.Slice(e.peerProbe.times, func(i, j int) bool { return e.peerProbe.times[i] < e.peerProbe.times[j] })
	return &e.peerProbe
}

// Replication defaults (replset's: ping timeout 6 s, ko 10 s), used when
// no settings name the peer.
var (
	defRepl        = replset.Defaults()
	defPingTimeout = time.Duration(defRepl.PingTimeout)
	defKoTimeout   = time.Duration(defRepl.KoTimeout)
)

// replFor returns the settings whose peer is addr, else the first
// settings, else the defaults; the string says which.
func (e *env) replFor(addr string) (Repl, string) {
	// Zero timeouts (settings given by a caller without defaults) take the
	// defaults: a zero limit would fail every RTT and a zero dial timeout
	// would mean none at all.
	norm := func(rp Repl) Repl {
		if rp.PingTimeout <= 0 {
			rp.PingTimeout = defPingTimeout
		}
		if rp.KoTimeout <= 0 {
			rp.KoTimeout = defKoTimeout
		}
		rp.Protocol = orString(rp.Protocol, defRepl.Protocol)
		return rp
	}
	for _, rp := range e.repls {
		if rp.Peer == addr {
			return norm(rp), "settings of volume " + rp.Volume
		}
	}
	if len(e.repls) > 0 {
		return norm(e.repls[0]), "settings of volume " + e.repls[0].Volume + " (its peer is " + e.repls[0].Peer + ")"
	}
	return norm(Repl{}), "defaults"
}

// RTT margins against min(ping timeout, ko timeout). The connect time is
// one idle round trip; under load queueing adds many, and a write waits
// for the secondary's disk as well, so the idle RTT must be a small
// fraction of the timeouts.
const (
	rttFailFactor = 4
	rttWarnFactor = 50
)

func (e *env) replChecks() []Result {
	if e.o.Peer == "" {
		return []Result{{Check: "repl.link", Status: OK, Evidence: "no --peer given: replication link not measured"}}
	}
	rp, src := e.replFor(e.o.Peer)
	r := Result{Check: "repl.link", Subject: e.o.Peer, Status: OK}
	if e.h.Connect == nil {
		return []Result{unreadable(r.Check, e.o.Peer, errNotAvailable)}
	}
	p := e.measure()
	limit := min(rp.PingTimeout, rp.KoTimeout)
	if len(p.times) == 0 {
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d TCP connects failed: %v", e.o.Probes, p.err)
		_, port, _ := net.SplitHostPort(e.o.Peer)
		r.Fix = fmt.Sprintf("check that vmsan serve runs on the peer with replication configured (vmsan repl configure) and that TCP port %s is open between the nodes", port)
		return []Result{r, e.bandwidthCheck(rp, src)}
	}
	med, worst := p.times[len(p.times)/2], p.times[len(p.times)-1]
	r.Evidence = fmt.Sprintf("TCP connect RTT median %v, max %v (%d/%d); ping_timeout %v, ko %v (%s)",
		med.Round(time.Microsecond), worst.Round(time.Microsecond), len(p.times), e.o.Probes, rp.PingTimeout, rp.KoTimeout, src)
	if med > 0 {
		r.Evidence += fmt.Sprintf("; protocol %s: one writer at queue depth 1 gets at most %s/s of 4 KiB writes from the RTT alone",
			rp.Protocol, human(int64(4096/med.Seconds())))
	}
	switch {
	case worst*rttFailFactor > limit:
		r.Status = Fail
	case worst*rttWarnFactor > limit:
		r.Status = Warn
	}
	if r.Status != OK {
		r.Evidence += fmt.Sprintf("; the timeouts leave room for only %.0f round trips: a busy link or a slow secondary disk will make the nodes disconnect and resync", float64(limit)/float64(worst))
		ticks := int64(worst*rttWarnFactor/(100*time.Millisecond)) + 1
		r.Fix = fmt.Sprintf("raise the timeouts on both nodes (vmsan repl configure VOLUME ... --ping-timeout %d --ko-ticks %d, in 100 ms ticks; or ping_timeout/ko_timeout in the configuration file), or use a lower-latency link", max(ticks, 60), max(ticks, 100))
	}
	return []Result{r, e.bandwidthCheck(rp, src)}
}

// bandwidthCheck compares the resync rate with the link speed of the
// interface towards the peer: resync above the link's capacity starves
// replicated application writes, which then hit the ko timeout.
func (e *env) bandwidthCheck(rp Repl, src string) Result {
	r := Result{Check: "repl.bandwidth", Subject: e.o.Peer, Status: OK}
	var speed int64
	var ifname string
	uses, _ := e.storageIfaces()
	for _, u := range uses {
		if contains(u.why, "peer "+e.o.Peer) {
			speed, ifname = e.linkSpeed(u.iface.Name), u.iface.Name
		}
	}
	if speed == 0 {
		r.Evidence = "link speed towards the peer unknown (virtual or loopback interface)"
		return r
	}
	link := speed * 1e6 / 8
	rate := "unlimited"
	if rp.ResyncRate > 0 {
		rate = human(rp.ResyncRate) + "/s"
	}
	r.Evidence = fmt.Sprintf("%s at %d Mb/s (%s/s); resync rate %s (%s)", ifname, speed, human(link), rate, src)
	if rp.ResyncRate > 0 && rp.ResyncRate*10 <= link*8 {
		return r
	}
	r.Status = Warn
	r.Evidence += "; resync can take the whole link, and replicated guest writes queue behind it"
	r.Fix = fmt.Sprintf("vmsan repl configure VOLUME ... --resync-rate %dM --resync-min-rate %dM (about 70%% and 10%% of the link)", link*7/10>>20, link/10>>20)
	return r
}
