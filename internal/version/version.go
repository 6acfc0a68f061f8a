// Package version reports which vmsan this is: the version string, the Go
// toolchain and the VCS revision the binary was built from.
//
// Simplest use:
//
//	i := version.Get()
//	fmt.Println(i.Version, i.Revision)
//
// Where the values come from: Go embeds the module version and, for builds
// inside a git checkout, vcs.revision/vcs.time/vcs.modified
// (runtime/debug.ReadBuildInfo). `go build` in a checkout leaves the main
// module's version at "(devel)", so the Makefile sets Version from
// `git describe --always --dirty` with
// -ldflags "-X github.com/vmsan/vmsan/internal/version.Version=...";
// `go install module@v1.2.3` fills it from the module version instead.
//
// Concurrency: Get is safe for concurrent use (it reads immutable data).
package version

import (
	"runtime"
	"runtime/debug"
)

// Version and Revision are set at link time by the Makefile (-X). Empty
// means "use what the build info says". The Makefile sets Revision too
// because builds with -buildvcs=false (or outside git) embed no vcs.*
// settings.
var Version, Revision string

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`
	GoVersion string `json:"go_version"`
	Revision  string `json:"revision,omitempty"` // VCS commit, "" when unknown
	Time      string `json:"revision_time,omitempty"`
	Modified  bool   `json:"modified,omitempty"` // built from a tree with uncommitted changes
}

// Get returns the binary's version information.
func Get() Info {
	return get(Version, Revision, debug.ReadBuildInfo)
}

func get(version, revision string, read func() (*debug.BuildInfo, bool)) Info {
	i := Info{Version: version, GoVersion: runtime.Version()}
	bi, ok := read()
	if ok {
		if bi.GoVersion != "" {
			i.GoVersion = bi.GoVersion
		}
		if i.Version == "" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.time":
				i.Time = s.Value
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if revision != "" {
		i.Revision = revision
	}
	if i.Version == "" || i.Version == "(devel)" {
		// A plain `go build`/`go run` without the Makefile's -X: say so
		// rather than print an empty or confusing version.
		i.Version = "devel"
		if i.Revision != "" {
			i.Version += "-" + short(i.Revision)
			if i.Modified {
				i.Version += "-dirty"
			}
		}
	}
	return i
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}
