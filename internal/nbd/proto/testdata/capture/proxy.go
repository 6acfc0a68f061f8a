package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
)

// one-off recording proxy: listen addr, upstream addr, out file
func main() {
	l, err := net.Listen("tcp", os.Args[1])
	if err != nil {
		panic(err)
	}
	out, _ := os.Create(os.Args[3])
	var mu sync.Mutex
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", os.Args[2])
		if err != nil {
			panic(err)
		}
		cp := func(dst, src net.Conn, dir string) {
			buf := make([]byte, 1<<20)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					mu.Lock()
					fmt.Fprintf(out, "%s %s\n", dir, hex.EncodeToString(buf[:n]))
					mu.Unlock()
					dst.Write(buf[:n])
				}
				if err != nil {
					if err != io.EOF {
					}
					dst.(*net.TCPConn).CloseWrite()
					return
				}
			}
		}
		go cp(u, c, "C")
		go cp(c, u, "S")
	}
}
