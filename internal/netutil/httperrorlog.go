package netutil

import (
	"log"
	"log/slog"
)

// HTTPErrorLog sends net/http's own error lines (malformed requests and
// the like, which any client can cause at will) to l at
// debug level, not to stderr unfiltered.
func HTTPErrorLog(l *slog.Logger) *log.Logger {
	return slog.NewLogLogger(l.Handler(), slog.LevelDebug)
}
