//go:build !linux

package doctor

import "time"

// RealHost returns a Host that examines the running machine. Off Linux
// only the files below Root are read; the checks that need Linux system
// calls report warn.
func RealHost() Host { return Host{Root: "/", Now: time.Now} }
