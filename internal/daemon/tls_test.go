package daemon

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/testutil"
)

// TestTLSRequired checks the TLS settings reach the server: with mode
// required, nbdinfo over nbds:// with the CA succeeds and plain nbd:// is
// refused.
func TestTLSRequired(t *testing.T) {
	testutil.NeedTool(t, "nbdinfo")
	dir := t.TempDir()
	certs := t.TempDir()
	testutil.WriteTLSCerts(t, certs)
	r := start(t, dir, func(c *config.Config) {
		c.TLS = config.TLS{Mode: "required", Cert: filepath.Join(certs, "server-cert.pem"), Key: filepath.Join(certs, "server-key.pem")}
		c.Volumes = []config.Volume{{Name: "sec", Size: 8 << 20}}
	})
	if !strings.Contains(r.out.String(), "nbds://") {
		t.Errorf("banner does not show an nbds:// URL for TLS required:\n%s", r.out.String())
	}
	if n := nbdSize(t, "nbds://"+r.tcp()+"/sec?tls-certificates="+certs); n != 8<<20 {
		t.Fatalf("size over TLS: %d", n)
	}
	if out, err := exec.Command("nbdinfo", "--size", r.url("sec")).CombinedOutput(); err == nil {
		t.Fatalf("plain connection accepted with TLS required: %s", out)
	}
}
