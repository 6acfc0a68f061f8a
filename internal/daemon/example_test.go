package daemon_test

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/volume"
)

// The embedded default: ./vmsan-data, 127.0.0.1:10809 and a Unix socket,
// a 10 GiB "default" volume; runs until SIGTERM/SIGINT, then drains.
func Example() {
	d, err := daemon.New(config.Default(), daemon.Options{Out: os.Stdout})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := d.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

// Volume operations that go through the running daemon when there is one,
// and straight to the directory otherwise.
func ExampleOpenVolumeOps() {
	ops, viaDaemon, err := daemon.OpenVolumeOps("./vmsan-data")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer ops.Close()
	vi, err := ops.Create(volume.CreateOptions{Name: "vm1", Size: 20 << 30})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	fmt.Println(vi.Name, vi.Size, viaDaemon)
}
