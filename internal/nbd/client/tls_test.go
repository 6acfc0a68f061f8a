package client

import (
	"testing"

	"github.com/vmsan/vmsan/internal/testutil"
)

func TestTLS(t *testing.T) {
	certs := t.TempDir()
	testutil.WriteTLSCerts(t, certs)
	uri := nbdkit(t, "--tls=require", "--tls-certificates="+certs, "memory", "8M")
	sock := uri[len("nbd+unix:///?socket="):]

	// Plain NBD is refused by a TLS-only server.
	if c, err := Dial(t.Context(), uri, nil); err == nil {
		c.Close()
		t.Fatal("plain connection to --tls=require server succeeded")
	}
	c := dial(t, "nbds+unix:///?socket="+sock+"&tls-certificates="+certs, nil)
	if !c.Export().TLS {
		t.Fatal("TLS not recorded")
	}
	buf := []byte("over TLS, pipelined")
	if _, err := c.WriteAt(buf, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(buf))
	if _, err := c.ReadAt(got, 4096); err != nil || string(got) != string(buf) {
		t.Fatalf("TLS round trip: %q, %v", got, err)
	}
	// A server certificate from an unknown CA is rejected.
	other := t.TempDir()
	testutil.WriteTLSCerts(t, other)
	if c2, err := Dial(t.Context(), "nbds+unix:///?socket="+sock+"&tls-certificates="+other, nil); err == nil {
		c2.Close()
		t.Fatal("certificate from an unknown CA accepted")
	}
}
