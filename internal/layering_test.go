// Package internal_test holds the layering test: a lint, run as a test,
// that fails when an import breaks the package layering drawn in
// docs/architecture.md ("Layering"). It reads the import graph with
// `go list` (non-test imports only: tests may reach across layers to
// build fixtures).
package internal_test

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

const mod = "github.com/vmsan/vmsan/"

// frontEndFamilies are the protocol front ends: each family's packages
// (codec, server, client) must not import another family's, nor daemon.
// Add "internal/nfs/" here when it lands.
var frontEndFamilies = []string{"internal/nbd/", "internal/iscsi/"}

// runtimePkgs are the volume runtime and the seam/leaf packages it is made
// of: below every front end, so they import none of them, nor daemon, nor
// a plugin (replication hooks in through volrt.Wrap, not an import).
// internal/scsi (the SCSI logical unit emulation) sits with them: the iSCSI
// target (and any later SCSI transport) imports it, it imports no front end.
var runtimePkgs = []string{"internal/volrt", "internal/export", "internal/alignbuf", "internal/scsi"}

// neutralPkgs read every front end through front-end-neutral types
// (volrt.FrontEndStats) and so import none of them: metrics exports the
// NBD front end's vmsan_nbd_* series from its neutral stats.
var neutralPkgs = []string{"internal/metrics"}

// configAllowed are the only project packages config may import directly:
// value parsers and constants (volume.ParseSize, backend.ParseCacheMode,
// config.Size) of packages that import nothing above them. No front end:
// config repeats the NBD limits it needs (a test on the NBD side checks
// the copies).
var configAllowed = map[string]bool{
	"internal/volume":  true,
	"internal/backend": true,
	// replset is the replication settings type (durations, protocol and
	// split-brain policy with their parsers, defaults, validation): config
	// converts its replication section to it and validates with it. It
	// is a leaf (leafPkgs), so this pulls in no subsystem.
	"internal/replset": true,
}

// hostPkgs are the interfaces the daemon implements for what it hosts
// and serves: host.Host for plugins, frontend.Host for front ends,
// control.Ops for the control API's handlers.
var hostPkgs = []string{"internal/host", "internal/frontend", "internal/control"}

// daemonParts are pieces of the daemon's own logic moved out of it, each
// with one job (TLS reloading, snapshot exports, ...): the daemon builds
// and calls them, so they import no daemon, no front end and no plugin.
var daemonParts = []string{"internal/tlsreload", "internal/snapexport", "internal/nospace", "internal/reload", "internal/volconf", "internal/volops"}

// leafPkgs import nothing from the project.
var leafPkgs = []string{"internal/replset", "internal/alignbuf", "internal/netutil", "internal/vfs", "internal/httpjson"}

// configKnownExceptions are imports that break the rule today, each with
// the step that removes it. An exception that is no longer needed fails
// the test, so the list cannot go stale. (Empty: issue 8's replication
// settings step removed config's import of repl.)
var configKnownExceptions = map[string]string{}

type pkg struct {
	path    string
	imports []string // direct, project-relative ("internal/x")
	deps    []string // transitive, project-relative
}

// loadGraph lists every package of the module with its direct and
// transitive project imports.
func loadGraph(t *testing.T) map[string]pkg {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := exec.LookPath(goBin); err != nil {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "list", "-e", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}|{{join .Deps \",\"}}|{{if .Error}}{{.Error}}{{end}}", "./...")
	cmd.Dir = ".." // the module root (this file is in internal/)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	rel := func(list string) []string {
		var r []string
		for _, p := range strings.Split(list, ",") {
			if q, ok := strings.CutPrefix(p, mod); ok {
				r = append(r, q)
			}
		}
		return r
	}
	g := map[string]pkg{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "|", 4)
		if len(f) != 4 {
			continue
		}
		path, ok := strings.CutPrefix(f[0], mod)
		if !ok {
			continue
		}
		if f[3] != "" {
			t.Errorf("%s: %s", path, f[3])
		}
		g[path] = pkg{path: path, imports: rel(f[1]), deps: rel(f[2])}
	}
	if len(g) < 10 {
		t.Fatalf("go list found only %d packages:\n%s", len(g), out)
	}
	return g
}

func family(p string) string {
	for _, f := range frontEndFamilies {
		if strings.HasPrefix(p+"/", f) {
			return f
		}
	}
	return ""
}

func TestLayering(t *testing.T) {
	g := loadGraph(t)
	var bad []string
	paths := make([]string, 0, len(g))
	for p := range g {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		pk := g[p]
		// Front ends do not import each other or daemon.
		if fam := family(p); fam != "" {
			for _, d := range pk.deps {
				if of := family(d); of != "" && of != fam {
					bad = append(bad, p+" (front end) imports front end "+d)
				}
				if d == "internal/daemon" || strings.HasPrefix(d, "internal/daemon/") {
					bad = append(bad, p+" (front end) imports "+d)
				}
			}
		}
		// Front ends (and the SCSI emulation) submit the runtime's request
		// type (export.Request), not the engine's: none imports the
		// engine directly, so how requests execute stays the runtime's.
		if family(p) != "" || p == "internal/scsi" {
			for _, d := range pk.imports {
				if d == "internal/ioengine" {
					bad = append(bad, p+" (front end) imports internal/ioengine: submit export.Request")
				}
			}
		}
		// The runtime imports no front end, no daemon, no plugin.
		for _, r := range runtimePkgs {
			if p != r {
				continue
			}
			for _, d := range pk.deps {
				if family(d) != "" || d == "internal/daemon" || d == "internal/repl" || strings.HasPrefix(d, "internal/repl/") {
					bad = append(bad, p+" (runtime) imports "+d)
				}
			}
		}
	}
	// The host seams (what the daemon offers plugins and front ends) are
	// built by the daemon, not on it: they import no daemon, no front end
	// and no plugin, so whatever is built against them does not either.
	for _, p := range hostPkgs {
		if _, ok := g[p]; !ok {
			bad = append(bad, p+" (host seam) not found")
		}
		for _, d := range g[p].deps {
			if family(d) != "" || d == "internal/daemon" || strings.HasPrefix(d, "internal/repl/driver") {
				bad = append(bad, p+" (host seam) imports "+d)
			}
		}
	}
	for _, p := range daemonParts {
		if _, ok := g[p]; !ok {
			bad = append(bad, p+" (daemon part) not found")
		}
		for _, d := range g[p].deps {
			if family(d) != "" || d == "internal/daemon" || d == "internal/repl" || strings.HasPrefix(d, "internal/repl/") {
				bad = append(bad, p+" (daemon part) imports "+d)
			}
		}
	}
	// config imports no front end, not even through its allowed parsers.
	for _, d := range g["internal/config"].deps {
		if family(d) != "" {
			bad = append(bad, "internal/config imports front end "+d)
		}
	}
	// doctor reads what the replication driver writes (replset decodes
	// it) and imports no replication driver.
	for _, d := range g["internal/doctor"].deps {
		if d == "internal/repl/driver" {
			bad = append(bad, "internal/doctor imports "+d+": decode with replset")
		}
	}
	// cmd is flag parsing over the daemon and its clients: no SCSI
	// emulation (the iSCSI front end re-exports what the CLI prints).
	for _, p := range paths {
		if !strings.HasPrefix(p, "cmd/") {
			continue
		}
		for _, d := range g[p].imports {
			if d == "internal/scsi" {
				bad = append(bad, p+" imports internal/scsi")
			}
		}
	}
	for _, p := range leafPkgs {
		if _, ok := g[p]; !ok {
			bad = append(bad, p+" (leaf) not found")
		}
		for _, d := range g[p].imports {
			bad = append(bad, p+" (leaf) imports "+d)
		}
	}
	for _, p := range neutralPkgs {
		for _, d := range g[p].deps {
			if family(d) != "" {
				bad = append(bad, p+" (front-end neutral) imports front end "+d)
			}
		}
	}
	// config imports no subsystem (direct imports; its allowed parsers'
	// own imports are checked by the rules above).
	used := map[string]bool{}
	for _, d := range g["internal/config"].imports {
		switch {
		case configAllowed[d]:
		case configKnownExceptions[d] != "":
			used[d] = true
		default:
			bad = append(bad, "internal/config imports subsystem "+d)
		}
	}
	for d, step := range configKnownExceptions {
		if !used[d] {
			bad = append(bad, "internal/config no longer imports "+d+": remove its known exception ("+step+")")
		}
	}
	for _, b := range bad {
		t.Error(b)
	}
	if len(bad) > 0 {
		t.Log("the layering is drawn in docs/architecture.md (Layering)")
	}
}
