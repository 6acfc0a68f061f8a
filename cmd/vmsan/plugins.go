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

// deleteHooks keep plugins' per-volume state in step with volume deletion,
// in the daemon and in `vmsan volume delete` without one.
var deleteHooks = []daemon.DeleteHooks{
	driver.DeleteHooks,
}
