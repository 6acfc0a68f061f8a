package frontend

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/vmsan/vmsan/internal/volume"
)

// BannerExport is the volume the banner shows: def (the default export)
// when set, else the first of vols by name; "" when there are no volumes.
func BannerExport(vols Volumes, def string) string {
	if def != "" {
		return def
	}
	names := make([]string, 0, len(vols))
	for n := range vols {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) > 0 {
		return names[0]
	}
	return ""
}

// WriteBanner writes how to use the daemon serving dataDir: the volumes,
// then each front end's lines (QEMU options and nbdinfo URLs for NBD);
// exp is BannerExport's.
func WriteBanner(w io.Writer, dataDir string, vols Volumes, exp string, fes []FrontEnd) {
	names := make([]string, 0, len(vols))
	for n := range vols {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(w, "vmsan: serving %d volume(s) from %s: %s\n", len(names), dataDir, strings.Join(names, ", "))
	if exp == "" {
		fmt.Fprintf(w, "vmsan: no volumes; create one with: vmsan volume create NAME --size 20G --data-dir %s\n", dataDir)
		return
	}
	if v := vols[exp]; v != nil {
		fmt.Fprintf(w, "vmsan: volume %q is %s (%d bytes), cache=%s\n", exp, volume.HumanSize(v.Size()), v.Size(), v.Meta().Cache)
	}
	for _, fe := range fes {
		for _, l := range fe.BannerLines() {
			fmt.Fprintln(w, l)
		}
	}
	fmt.Fprintf(w, "Control: vmsan status --data-dir %s\n", dataDir)
}
