package daemon

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/config"
)

// TestDeprecatedKeysLoggedAtStart: a configuration file that set the NBD
// keys at the top level (config.Config.Deprecated) gets one warning per
// key when the daemon starts, naming the nbd: key to use instead.
func TestDeprecatedKeysLoggedAtStart(t *testing.T) {
	cfg, err := config.Parse([]byte("listen: [\"127.0.0.1:0\"]\nmax_connections: 5\n"))
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	startOpts(t, t.TempDir(), func(c *config.Config) { c.Deprecated = cfg.Deprecated }, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	out := logs.String()
	for _, k := range []string{"listen", "max_connections"} {
		if !strings.Contains(out, `top-level \"`+k+`\" is deprecated`) || !strings.Contains(out, "nbd."+k) {
			t.Errorf("no deprecation warning for %s in:\n%s", k, out)
		}
	}
}
