package doctor

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
)

// Vendor is the SCSI vendor identification vmsan's iSCSI target reports
// (the multipath.conf device section matches on it).
const Vendor = "VMSAN"

// Paths of the client-side configuration files (below Host.Root).
const (
	MultipathConf = "/etc/multipath.conf"
	IscsidConf    = "/etc/iscsi/iscsid.conf"
)

// mpSection is a parsed multipath.conf section: "devices { device { ... } }".
type mpSection struct {
	name     string
	kv       map[string]string
	children []*mpSection
}

// mpTokens splits a line into words and "quoted strings" and drops a #
// or ! comment (the two comment characters multipath accepts).
func mpTokens(line string) []string {
	var out []string
	for i := 0; i < len(line); {
		c := line[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '#' || c == '!':
			return out
		case c == '"':
			j := strings.IndexByte(line[i+1:], '"')
			if j < 0 {
				out = append(out, line[i+1:])
				return out
			}
			out = append(out, line[i+1:i+1+j])
			i += j + 2
		case c == '{' || c == '}':
			out = append(out, string(c))
			i++
		default:
			j := i
			for j < len(line) && !strings.ContainsRune(" \t\r{}\"#!", rune(line[j])) {
				j++
			}
			out = append(out, line[i:j])
			i = j
		}
	}
	return out
}

// parseMultipath builds the section tree. Unbalanced braces are tolerated
// (a stray "}" is ignored, an unclosed section ends at EOF) because the
// point is to report on the file, not to reject it.
func parseMultipath(s string) *mpSection {
	root := &mpSection{kv: map[string]string{}}
	stack := []*mpSection{root}
	for _, line := range strings.Split(s, "\n") {
		t := mpTokens(line)
		for len(t) > 0 {
			cur := stack[len(stack)-1]
			switch {
			case t[0] == "}":
				if len(stack) > 1 {
					stack = stack[:len(stack)-1]
				}
				t = t[1:]
			case len(t) >= 2 && t[1] == "{":
				sec := &mpSection{name: t[0], kv: map[string]string{}}
				cur.children = append(cur.children, sec)
				if len(stack) < 16 {
					stack = append(stack, sec)
				}
				t = t[2:]
			default:
				k := t[0]
				rest := t[1:]
				var vals []string
				for len(rest) > 0 && rest[0] != "}" {
					vals = append(vals, rest[0])
					rest = rest[1:]
				}
				cur.kv[k] = strings.Join(vals, " ")
				t = rest
			}
		}
	}
	return root
}

func (s *mpSection) find(name string) []*mpSection {
	var out []*mpSection
	for _, c := range s.children {
		if c.name == name {
			out = append(out, c)
		}
	}
	return out
}

// vendorMatches: multipath treats vendor as a regular expression.
func vendorMatches(pattern string) bool {
	re, err := regexp.Compile(pattern)
	if err != nil {
		return pattern == Vendor
	}
	return re.MatchString(Vendor)
}

// MultipathSection is the device section vmsan recommends: ALUA decides
// which paths are active (on a replicated pair only the primary's
// portals), TUR detects a dead path cheaply, and queueing for a while
// when all paths are gone rides out a node failover instead of handing
// I/O errors to the guest.
const MultipathSection = `devices {
    device {
        vendor "VMSAN"
        product ".*"
        path_grouping_policy group_by_prio
        prio alua
        hardware_handler "1 alua"
        path_checker tur
        failback immediate
        no_path_retry 12
    }
}`

var mpWant = []struct{ key, want, why string }{
	{"path_grouping_policy", "group_by_prio", "paths are grouped by ALUA state, so standby paths carry no I/O"},
	{"prio", "alua", "priorities come from the target's ALUA states"},
	{"hardware_handler", "1 alua", "scsi_dh_alua follows state changes"},
	{"path_checker", "tur", "TEST UNIT READY detects a dead path without reading data"},
	{"failback", "immediate", "I/O returns to the optimized path as soon as it is back"},
}

func (e *env) multipathCheck() Result {
	r := Result{Check: "client.multipath", Subject: MultipathConf, Status: OK}
	s, err := e.h.readFileN(MultipathConf, 1<<20)
	if errors.Is(err, fs.ErrNotExist) {
		r.Evidence = "not present: not a dm-multipath client"
		return r
	}
	if err != nil {
		return unreadable(r.Check, MultipathConf, err)
	}
	root := parseMultipath(s)
	var dev *mpSection
	for _, ds := range root.find("devices") {
		for _, d := range ds.find("device") {
			if vendorMatches(d.kv["vendor"]) {
				dev = d
			}
		}
	}
	if dev == nil {
		r.Status = Warn
		r.Evidence = "no device section for vendor " + Vendor + ": its LUNs get multipath's generic defaults (no ALUA grouping, errors instead of queueing on failover)"
		r.Fix = "add to " + MultipathConf + ": " + oneLine(MultipathSection) + "; then systemctl reload multipathd"
		return r
	}
	var bad, good []string
	for _, w := range mpWant {
		got, ok := dev.kv[w.key]
		if !ok || got != w.want {
			if !ok {
				got = "unset"
			}
			bad = append(bad, fmt.Sprintf("%s %s (want %s: %s)", w.key, quoteIfSpace(got), quoteIfSpace(w.want), w.why))
		} else {
			good = append(good, w.key+" "+quoteIfSpace(got))
		}
	}
	npr, ok := dev.kv["no_path_retry"]
	feat := dev.kv["features"]
	switch {
	case !ok && strings.Contains(feat, "queue_if_no_path"):
		good = append(good, `features "`+feat+`" (queues forever when all paths are gone)`)
	case !ok:
		bad = append(bad, "no_path_retry unset (want a number of checker intervals, e.g. 12: without it all paths down fails I/O at once, and a node failover becomes guest I/O errors)")
	case npr == "fail" || npr == "0":
		bad = append(bad, "no_path_retry "+npr+" (want e.g. 12: all paths down fails I/O at once, so a node failover becomes guest I/O errors)")
	case npr == "queue":
		good = append(good, "no_path_retry queue (queues forever: a guest hangs rather than errs if the array never returns)")
	default:
		if n, err := strconv.Atoi(npr); err != nil || n < 1 {
			bad = append(bad, "no_path_retry "+npr+" (want a positive number or queue)")
		} else {
			good = append(good, "no_path_retry "+npr)
		}
	}
	r.Evidence = "device section for " + Vendor
	if len(good) > 0 {
		r.Evidence += ": " + strings.Join(good, ", ")
	}
	if len(bad) > 0 {
		r.Status = Warn
		r.Evidence += "; wrong: " + strings.Join(bad, "; ")
		r.Fix = "set in the " + Vendor + " device section of " + MultipathConf + ": " + oneLine(MultipathSection) + "; then systemctl reload multipathd"
	}
	return r
}

func quoteIfSpace(s string) string {
	if strings.ContainsRune(s, ' ') {
		return `"` + s + `"`
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// open-iscsi settings and their defaults.
const (
	keyReplacement  = "node.session.timeo.replacement_timeout"
	keyNoopInterval = "node.conn[0].timeo.noop_out_interval"
	keyNoopTimeout  = "node.conn[0].timeo.noop_out_timeout"

	defReplacement = 120
	defNoop        = 5
	// maxReplacement: with dm-multipath the session's replacement timeout
	// is how long I/O on a dead path waits before multipath may retry it
	// on another path; above 5 s a path loss stalls the guest longer than
	// vmsan's failover target, and beyond ~30 s the guest's own SCSI
	// timeouts fire.
	maxReplacement = 5
	maxNoop        = 5
)

// The open-iscsi timers `vmsan iscsi multipath-conf` prints and the fixes
// suggested here: a dead connection is noticed within NOP interval +
// timeout (2 s) and its I/O moves to another path ReplacementTimeout (2 s)
// later, about 4 s in all. Tested by the guest multipath tests.
const (
	RecommendedReplacementTimeout = 2
	RecommendedNoopInterval       = 1
	RecommendedNoopTimeout        = 1
)

func parseIscsid(s string) map[string]string {
	kv := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		kv[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return kv
}

func (e *env) iscsiCheck() Result {
	r := Result{Check: "client.iscsi", Subject: IscsidConf, Status: OK}
	s, err := e.h.readFileN(IscsidConf, 1<<20)
	if errors.Is(err, fs.ErrNotExist) {
		r.Evidence = "not present: not an open-iscsi client"
		return r
	}
	if err != nil {
		return unreadable(r.Check, IscsidConf, err)
	}
	kv := parseIscsid(s)
	val := func(k string, def int) (int, string) {
		v, ok := kv[k]
		if !ok {
			return def, fmt.Sprintf("%d (default)", def)
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return -1, v + " (not a number)"
		}
		return n, v
	}
	rep, reps := val(keyReplacement, defReplacement)
	ni, nis := val(keyNoopInterval, defNoop)
	nt, nts := val(keyNoopTimeout, defNoop)
	r.Evidence = fmt.Sprintf("replacement_timeout %s, noop_out_interval %s, noop_out_timeout %s", reps, nis, nts)
	_, mpErr := e.h.readFileN(MultipathConf, 1)
	multipath := !errors.Is(mpErr, fs.ErrNotExist)
	var fixes []string
	if rep < 0 || (rep > maxReplacement && multipath) {
		r.Evidence += fmt.Sprintf("; with dm-multipath, I/O on a dead path waits %s s before another path may take it", reps)
		fixes = append(fixes, fmt.Sprintf("%s = %d", keyReplacement, RecommendedReplacementTimeout))
	} else if rep > maxReplacement {
		r.Evidence += "; no multipath.conf: a long timeout keeps single-path I/O queued through a reconnect, which is right"
	}
	if ni <= 0 || ni > maxNoop {
		r.Evidence += "; a dead connection is noticed late (noop_out_interval 0 disables the check)"
		fixes = append(fixes, fmt.Sprintf("%s = %d", keyNoopInterval, RecommendedNoopInterval))
	}
	if nt <= 0 || nt > maxNoop {
		r.Evidence += "; noop_out_timeout delays path failure detection"
		fixes = append(fixes, fmt.Sprintf("%s = %d", keyNoopTimeout, RecommendedNoopTimeout))
	}
	if len(fixes) == 0 {
		return r
	}
	r.Status = Warn
	var upd []string
	for _, f := range fixes {
		k, v, _ := strings.Cut(f, " = ")
		upd = append(upd, fmt.Sprintf("iscsiadm -m node -o update -n %s -v %s", k, v))
	}
	r.Fix = "set in " + IscsidConf + ": " + strings.Join(fixes, "; ") + "; existing node records keep their old values: " + strings.Join(upd, "; ") + "; then log the sessions out and in"
	return r
}
