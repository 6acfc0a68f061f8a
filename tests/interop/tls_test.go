package interop

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/testutil"
	"github.com/vmsan/vmsan/tests/interop/servers"
)

// TestTLSClientCertKeyTypes serves a volume with TLS required and client
// certificates verified against a CA, and connects with the two GnuTLS
// clients (nbdinfo through libnbd, qemu-img through QEMU's tls-creds-x509)
// using RSA and ECDSA keys. RSA once failed over TLS 1.3 with "client
// didn't provide a certificate": GnuTLS matched its certificate against the
// CA names in the CertificateRequest and dropped it (see
// internal/daemon/tls.go). A client certificate from another CA must still
// be refused.
func TestTLSClientCertKeyTypes(t *testing.T) {
	t.Parallel()
	if serverKind == servers.NBDServer {
		t.Skip("servers.Options.TLSDir does not support nbd-server") // skip: variant
	}
	testutil.NeedTool(t, "nbdinfo")
	testutil.NeedTool(t, "qemu-img")
	for _, kt := range []testutil.KeyType{testutil.ECDSA, testutil.RSA} {
		t.Run(string(kt), func(t *testing.T) {
			t.Parallel()
			certs := testutil.WriteTLSCertsKey(t, t.TempDir(), kt)
			const size = 16 * MiB
			tg := newTarget(t, size, withTLS(certs.Dir))
			host, port, err := net.SplitHostPort(tg.srv.Addr)
			if err != nil {
				t.Fatal(err)
			}
			tlsURI := func(dir string) string {
				return "nbds://" + tg.srv.Addr + "/" + tg.name + "?tls-certificates=" + dir
			}

			out := mustRun(t, 30*time.Second, "nbdinfo", "--size", tlsURI(certs.Dir))
			if got := strings.TrimSpace(out); got != strconv.FormatInt(size, 10) {
				t.Fatalf("nbdinfo --size over TLS with a %s client certificate: %q, want %d", kt, got, size)
			}
			out = mustRun(t, 30*time.Second, "qemu-img", "info", "--output=json",
				"--object", "tls-creds-x509,id=tls0,dir="+certs.Dir+",endpoint=client",
				"--image-opts", "driver=nbd,host="+host+",port="+port+",export="+tg.name+",tls-creds=tls0")
			if !strings.Contains(out, `"virtual-size": `+strconv.FormatInt(size, 10)) {
				t.Fatalf("qemu-img info over TLS with a %s client certificate:\n%s", kt, out)
			}

			// The same client key type, signed by a CA the server does not
			// trust (the directory trusts the server, so only the server
			// can refuse): the server must refuse it.
			other := testutil.WriteTLSCertsKey(t, t.TempDir(), kt)
			mixed := t.TempDir()
			for src, name := range map[string]string{
				certs.File("ca-cert.pem"):     "ca-cert.pem",
				other.File("client-cert.pem"): "client-cert.pem",
				other.File("client-key.pem"):  "client-key.pem",
			} {
				b, err := os.ReadFile(src)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(mixed, name), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if r := runCmd(t, 30*time.Second, "nbdinfo", "--size", tlsURI(mixed)); r.code == 0 {
				t.Fatalf("a client certificate from an untrusted CA was accepted: %s", r.stdout)
			}
			if serverKind == servers.VMSAN {
				// The client may exit on the server's alert before the
				// server has logged the refusal: give the log a moment.
				logged := false
				for deadline := time.Now().Add(5 * time.Second); !logged && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					logged = strings.Contains(tg.srv.LogTail(1<<16), "client certificate refused")
				}
				if !logged {
					t.Errorf("server log does not say why the untrusted client was refused:\n%s", tg.srv.LogTail(4000))
				}
			}
		})
	}
}
