package main

import (
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/volume"
)

// Errors that tell the user to override with a flag name the flag as it is
// typed on the command line ("--force"), not as a bare word.
func TestForceMessagesNameTheFlag(t *testing.T) {
	for _, err := range []error{volume.ErrInUse, volume.ErrShrink, repl.ErrNotUpToDate} {
		if !strings.Contains(err.Error(), "--force") {
			t.Errorf("%q does not name --force", err)
		}
	}
}
