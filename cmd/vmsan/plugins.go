package main

import (
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
)

// plugins are the daemon plugins `vmsan serve` builds, in order (one line
// per plugin): passed explicitly in daemon.Options, so a daemon built
// elsewhere (tests) has exactly the plugins it asks for.
var plugins = []daemon.PluginFactory{
	driver.NewPlugin,
}

// volumeHooks keep plugins' per-volume state in step with volume deletion
// and refuse resizes replication cannot follow, in the daemon and in
// `vmsan volume` commands run without one.
var volumeHooks = daemon.VolumeHooks{
	Delete: []daemon.DeleteHooks{driver.DeleteHooks},
	Resize: []daemon.ResizeCheck{driver.ResizeCheck},
}
