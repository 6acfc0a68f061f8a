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

// volumeHooks refuse deletes and resizes replication cannot follow, in
// the daemon and in `vmsan volume` commands run without one. (Plugins'
// per-volume state is in the volume's state directory: deleting the volume
// deletes it, no hook needed.)
var volumeHooks = daemon.VolumeHooks{
	Delete: []daemon.DeleteCheck{driver.DeleteCheck},
	Resize: []daemon.ResizeCheck{driver.ResizeCheck},
}
