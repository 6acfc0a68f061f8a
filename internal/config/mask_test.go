package config

import (
	"strings"
	"testing"
)

// Secrets are masked by the name of their key, so ones added later
// (a replication shared_secret) are masked without being listed; the
// files that hold secrets are shown.
func TestIsSecretKey(t *testing.T) {
	for k, want := range map[string]bool{
		"secret": true, "mutual_secret": true, "shared_secret": true, "password": true, "Secret": true,
		"secret_file": false, "mutual_secret_file": false, "user": false, "key": false, "tls": false, "secrets_dir": false,
	} {
		if got := IsSecretKey(k); got != want {
			t.Errorf("IsSecretKey(%q) = %v, want %v", k, got, want)
		}
	}
}

func TestMarshalMasked(t *testing.T) {
	c := Default()
	c.ISCSI.Listen = []ISCSIPortal{{Addr: "127.0.0.1:3260"}}
	c.ISCSI.Auth = &ISCSIAuth{User: "u", Secret: "twelve+chars+x", MutualUser: "t", MutualSecret: "other+secret+y"}
	c.ISCSI.DiscoveryAuth = &ISCSIAuth{User: "d", SecretFile: "/etc/vmsan/disc.secret"}
	b, err := c.MarshalMasked()
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if strings.Contains(s, "twelve+chars+x") || strings.Contains(s, "other+secret+y") || strings.Count(s, Masked) != 2 {
		t.Fatalf("secrets not masked:\n%s", s)
	}
	if !strings.Contains(s, "/etc/vmsan/disc.secret") || !strings.Contains(s, "user: u") {
		t.Fatalf("non-secret fields lost:\n%s", s)
	}
}
