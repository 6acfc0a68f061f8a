package backend_test

import (
	"fmt"

	"github.com/vmsan/vmsan/internal/backend"
)

func ExampleMem() {
	m := backend.NewMem(64 << 10)
	// Two buffers, one vectored write.
	if err := m.WritevAt([][]byte{[]byte("hello, "), []byte("world")}, 8192, false); err != nil {
		fmt.Println(err)
	}
	buf := make([]byte, 12)
	m.ReadvAt([][]byte{buf}, 8192)
	fmt.Printf("%s\n", buf)
	ext, _ := m.Extents(0, 64<<10)
	for _, e := range ext {
		fmt.Printf("%d+%d hole=%v\n", e.Offset, e.Length, e.Hole)
	}
	// Output:
	// hello, world
	// 0+8192 hole=true
	// 8192+4096 hole=false
	// 12288+53248 hole=true
}
