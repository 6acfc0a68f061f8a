package ioengine_test

import (
	"fmt"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/ioengine"
)

func Example() {
	b := backend.NewMem(1 << 20)
	e := ioengine.New(b, ioengine.Config{Workers: 2})

	// Asynchronous submission: Done is called once, from an engine goroutine.
	done := make(chan *ioengine.Request, 1)
	e.Submit(&ioengine.Request{
		Op: ioengine.OpWrite, Offset: 4096, Length: 5, Data: []byte("hello"),
		FUA:  true,
		Done: func(r *ioengine.Request) { done <- r },
	})
	if r := <-done; r.Err != nil {
		fmt.Println("write:", r.Err)
	}

	// Synchronous helper.
	buf := make([]byte, 5)
	err := e.Do(&ioengine.Request{Op: ioengine.OpRead, Offset: 4096, Length: 5, Data: buf})
	fmt.Println(string(buf), err)
	fmt.Println(e.Do(&ioengine.Request{Op: ioengine.OpFlush}))

	if err := e.Close(); err != nil {
		fmt.Println("close:", err)
	}
	s := e.Stats()
	fmt.Println(s.Requests.Write, s.Requests.Read, s.Requests.Flush)
	// Output:
	// hello <nil>
	// <nil>
	// 1 1 1
}
