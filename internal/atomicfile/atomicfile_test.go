package atomicfile

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "meta.json")
	for _, content := range []string{"first", "second, longer contents", "3"} {
		if err := WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, []byte(content)) {
			t.Fatalf("got %q want %q", got, content)
		}
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o640 {
		t.Fatalf("perm %v", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("leftover files: %v", ents)
	}
}

func TestWriteFileErrorLeavesOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "meta.json")
	if err := WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Renaming a file over a non-empty directory fails: the old target stays.
	sub := filepath.Join(dir, "sub")
	os.MkdirAll(filepath.Join(sub, "x"), 0o755)
	if err := WriteFile(sub, []byte("new"), 0o644); err == nil {
		t.Fatal("expected error writing over a directory")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if IsTemp(e.Name()) {
			t.Fatalf("temp file left after error: %s", e.Name())
		}
	}
	got, _ := os.ReadFile(p)
	if string(got) != "old" {
		t.Fatalf("old file changed: %q", got)
	}
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, TempPrefix+"a.json-123"), []byte("partial"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.json"), []byte("real"), 0o644)
	n, err := RemoveTemps(dir)
	if err != nil || n != 1 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a.json")); err != nil {
		t.Fatal("real file removed")
	}
}
