package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmsan/vmsan/internal/alignbuf"
	"github.com/vmsan/vmsan/internal/nbd/client"
	"github.com/vmsan/vmsan/internal/sparse"
	"github.com/vmsan/vmsan/internal/volume"
)

// Incremental export (`vmsan volume export ... --since SNAP --backing
// BASE`): a qcow2 overlay whose backing file is BASE, a full export of the
// snapshot SNAP made earlier, holding only the blocks that differ between
// SNAP and what is exported now. Changed blocks are found by comparing
// contents (both raw files are read where either holds data; holes on
// both sides, and blocks the two share by reflink, are skipped without
// reading). Blocks that became zero are
// written as qcow2 zero clusters, so the overlay reads exactly as the
// exported volume. The overlay is written through qemu-nbd (the qcow2
// writer is QEMU's), so it needs qemu-img and qemu-nbd. Restore with
// `vmsan volume import NAME OVERLAY` (qemu-img follows the backing chain).

// exportSince writes the overlay dst (backing: backing, as stored in the
// overlay: relative paths are relative to dst's directory) with the
// blocks of src that differ from base. src and base are raw files; size
// is src's size (base may be shorter or longer: it is read as zeroes past
// its end).
func exportSince(ctx context.Context, src, base string, size int64, dst, backing string, quiet bool) error {
	for _, tool := range []string{"qemu-img", "qemu-nbd"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("--since needs %s (package qemu-utils): %w", tool, err)
		}
	}
	bpath := backing
	if !filepath.IsAbs(bpath) {
		bpath = filepath.Join(filepath.Dir(dst), backing)
	}
	bi, err := qemuImgInfo(ctx, bpath)
	if err != nil {
		return fmt.Errorf("--backing %s: %w", backing, err)
	}
	out, err := exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-b", backing, "-F", bi.Format, dst, strconv.FormatInt(size, 10)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create: %v: %s", err, strings.TrimSpace(string(out)))
	}
	ok := false
	defer func() {
		if !ok {
			os.Remove(dst)
		}
	}()
	sdir, err := os.MkdirTemp("", "vmsan-export-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(sdir)
	sock := filepath.Join(sdir, "nbd.sock")
	// Without --persistent qemu-nbd exits when its one client disconnects.
	qn := exec.CommandContext(ctx, "qemu-nbd", "-f", "qcow2", "-x", "overlay", "-k", sock, dst)
	var qlog bytes.Buffer
	qn.Stdout, qn.Stderr = &qlog, &qlog
	if err := qn.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- qn.Wait() }()
	defer func() {
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			qn.Process.Kill()
			<-exited
		}
	}()
	var c *client.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err = client.Dial(ctx, "nbd+unix:///overlay?socket="+sock, &client.Options{Connections: 1})
		if err == nil {
			break
		}
		select {
		case e := <-exited:
			exited <- e
			return fmt.Errorf("qemu-nbd exited: %v: %s", e, strings.TrimSpace(qlog.String()))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu-nbd did not start: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	set, done := progress("export (incremental)", size, quiet)
	written, read, err := writeDiff(ctx, c, src, base, size, set)
	done()
	if err == nil {
		err = c.Flush()
	}
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	ok = true
	if !quiet {
		fmt.Fprintf(os.Stderr, "vmsan: incremental export: %d bytes changed since the base (%d bytes read to compare)\n", written, read)
	}
	return nil
}

// diffTarget is where changed blocks go (an NBD connection to the overlay).
type diffTarget interface {
	WriteAt(p []byte, off int64) (int, error)
	Zero(off, length int64, flags client.ZeroFlags) error
}

// writeDiff writes to t every sparse.Block of src (size bytes) that
// differs from base, as data or as zeroes; it returns the bytes written
// and the bytes read from each file to compare. Chunks whose blocks the
// two files share (reflinks of the same volume that neither side wrote
// since: same physical addresses, sparse.SameBlocks) are equal without
// being read.
func writeDiff(ctx context.Context, t diffTarget, src, base string, size int64, progress func(int64)) (written, read int64, err error) {
	sf, err := volume.OpenImageFile(src)
	if err != nil {
		return 0, 0, err
	}
	defer sf.Close()
	bf, err := volume.OpenImageFile(base)
	if err != nil {
		return 0, 0, err
	}
	defer bf.Close()
	// No extent map (no FIEMAP, too fragmented): nil lists, nothing
	// counts as shared, everything with data is read.
	sext, _ := sf.Extents()
	bext, _ := bf.Extents()
	sdata, bdata := sf.Data, bf.Data
	const chunk = 1 << 20
	sb, bb := make([]byte, chunk), make([]byte, chunk)
	readAt := func(f volume.Image, b []byte, off int64) error {
		n, err := f.ReadAt(b, off)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		clear(b[n:]) // past the end: zeroes
		return nil
	}
	// next returns the start of the next range where either file has data.
	next := func(off int64) (int64, error) {
		s1, _, ok1, err := sdata(off)
		if err != nil {
			return 0, err
		}
		s2, _, ok2, err := bdata(off)
		if err != nil {
			return 0, err
		}
		switch {
		case ok1 && ok2:
			return min(s1, s2), nil
		case ok1:
			return s1, nil
		case ok2:
			return s2, nil
		}
		return size, nil
	}
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return written, read, err
		}
		d, err := next(off)
		if err != nil {
			return written, read, err
		}
		// Both holes up to d: equal, nothing to write. Align down so
		// blocks are compared whole.
		d = max(off, d/sparse.Block*sparse.Block)
		if d >= size {
			break
		}
		n := int(min(int64(chunk), size-d))
		if volume.SameBlocks(sext, bext, d, int64(n)) {
			off = d + int64(n)
			progress(off)
			continue
		}
		if err := readAt(sf, sb[:n], d); err != nil {
			return written, read, err
		}
		if err := readAt(bf, bb[:n], d); err != nil {
			return written, read, err
		}
		read += int64(n)
		for i := 0; i < n; {
			j := min(n, i+sparse.Block)
			if bytes.Equal(sb[i:j], bb[i:j]) {
				i = j
				continue
			}
			// A run of differing blocks, all zero or all data in src.
			zero := alignbuf.IsZero(sb[i:j])
			k := j
			for k < n {
				e := min(n, k+sparse.Block)
				if bytes.Equal(sb[k:e], bb[k:e]) || alignbuf.IsZero(sb[k:e]) != zero {
					break
				}
				k = e
			}
			if zero {
				err = t.Zero(d+int64(i), int64(k-i), 0)
			} else {
				_, err = t.WriteAt(sb[i:k], d+int64(i))
			}
			if err != nil {
				return written, read, fmt.Errorf("write to the overlay at %d: %w", d+int64(i), err)
			}
			written += int64(k - i)
			i = k
		}
		off = d + int64(n)
		progress(off)
	}
	return written, read, nil
}
