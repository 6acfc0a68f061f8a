package target

import (
	"bytes"
	"net"
	"testing"
)

// TestSendBufGathers: copied and referenced segments go out in the order
// written, all at the Flush; a referenced segment is not copied (changing
// it before the Flush shows on the wire); Flush resets the buffer.
func TestSendBufGathers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		var b bytes.Buffer
		b.ReadFrom(c)
		got <- b.Bytes()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := newSendBuf(c)
	long := bytes.Repeat([]byte{'L'}, refMin)
	var want []byte
	for k := 0; k < 3; k++ {
		hdr := bytes.Repeat([]byte{byte('a' + k)}, 48)
		b.Write(hdr)
		b.Ref(long)
		want = append(append(want, hdr...), bytes.Repeat([]byte{'M'}, refMin)...)
	}
	b.Write([]byte("tail"))
	want = append(want, "tail"...)
	if b.Refs() != 3 || b.Buffered() != len(want) {
		t.Fatalf("Refs %d Buffered %d, want 3 and %d", b.Refs(), b.Buffered(), len(want))
	}
	if len(b.iov) != 6 {
		t.Fatalf("%d segments before the flush's cut, want 6", len(b.iov))
	}
	copy(long, bytes.Repeat([]byte{'M'}, refMin)) // referenced, not copied
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if b.Refs() != 0 || b.Buffered() != 0 || len(b.iov) != 0 {
		t.Fatalf("after Flush: Refs %d Buffered %d iov %d", b.Refs(), b.Buffered(), len(b.iov))
	}
	b.Write([]byte("next"))
	b.Flush()
	c.Close()
	if g := <-got; !bytes.Equal(g, append(want, "next"...)) {
		t.Fatalf("received %d bytes, want %d (order or content differs)", len(g), len(want)+4)
	}
}
