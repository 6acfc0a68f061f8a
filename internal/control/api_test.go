package control

import (
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"

	"github.com/vmsan/vmsan/internal/volume"
)

// TestStatusOf: wrapped store errors keep their code and a 4xx, a full
// filesystem is 507, a bad request body 400, anything else 500; and an
// APIError decoded from a reply matches the sentinel it stands for.
func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		err  error
		st   int
		code string
	}{
		{fmt.Errorf("volume x: %w", volume.ErrNotFound), http.StatusNotFound, "not_found"},
		{fmt.Errorf("x: %w", volume.ErrBadSize), http.StatusBadRequest, "bad_size"},
		{fmt.Errorf("x: %w", volume.ErrInUse), http.StatusConflict, "in_use"},
		{fmt.Errorf("x: %w", volume.ErrHasSnapshots), http.StatusConflict, "has_snapshots"},
		{fmt.Errorf("resize: %w", ErrReplicated), http.StatusConflict, "replicated"},
		{fmt.Errorf("write meta: %w", syscall.ENOSPC), http.StatusInsufficientStorage, "no_space"},
		{&APIError{Code: "bad_request", Message: "bad body"}, http.StatusBadRequest, "bad_request"},
		{errors.New("disk on fire"), http.StatusInternalServerError, "internal"},
	} {
		st, ae := StatusOf(c.err)
		if st != c.st || ae.Code != c.code {
			t.Errorf("StatusOf(%v) = %d %q, want %d %q", c.err, st, ae.Code, c.st, c.code)
		}
	}
	if ae := (&APIError{Code: "exists"}); !errors.Is(ae, volume.ErrExists) || errors.Is(ae, volume.ErrNotFound) {
		t.Error("APIError{exists} does not map back to volume.ErrExists alone")
	}
	if got := ErrorCode(fmt.Errorf("dial: %w", ErrNoDaemon)); got != "no_daemon" {
		t.Errorf("ErrorCode(ErrNoDaemon) = %q", got)
	}
}
