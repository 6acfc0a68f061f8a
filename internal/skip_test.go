package internal_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// skipReasons are the reasons a test may skip itself with a raw t.Skip
// (marked `// skip: REASON` on the call's line). Anything else (a missing
// tool, root, loop devices, a mount, a kernel module) is the environment,
// and goes through testutil.SkipOrFail, NeedTool or NeedRoot, which fail
// in CI: a CI run that silently skips what it cannot run tests nothing.
var skipReasons = map[string]string{
	"short":    "testing.Short(): the test is long",
	"race":     "the race detector changes what is measured (allocations)",
	"soak":     "a soak test, run by make soak",
	"variant":  "the test does not apply to this run's variant (another server or target under test)",
	"platform": "the kernel or platform lacks a feature the code falls back from",
	"port":     "an ephemeral port the test released was taken meanwhile by another process",
}

// skipCall matches a skip on a testing.TB: t.Skip(, b.Skipf(, tb.SkipNow(.
var skipCall = regexp.MustCompile(`\b\w+\.Skip(f|Now)?\(`)

var skipMark = regexp.MustCompile(`// skip: (\w+)`)

// TestSkipsFailInCI fails on a raw skip without an allowed reason: every
// other skip must go through internal/testutil, whose helpers skip only
// off CI.
func TestSkipsFailInCI(t *testing.T) {
	root := ".." // the module root (this file is in internal/)
	n := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		// testutil's own helpers are the sanctioned skips.
		if !strings.HasSuffix(path, ".go") || rel == filepath.Join("internal", "testutil", "testutil.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for line := 1; sc.Scan(); line++ {
			text := sc.Text()
			code, _, _ := strings.Cut(text, "//")
			if !skipCall.MatchString(code) {
				continue
			}
			n++
			m := skipMark.FindStringSubmatch(text)
			if m == nil {
				t.Errorf("%s:%d: raw skip without a reason: use testutil.SkipOrFail/NeedTool/NeedRoot (they fail in CI), or mark a legitimate skip `// skip: REASON` (%s)", rel, line, strings.Join(reasonNames(), ", "))
				continue
			}
			if _, ok := skipReasons[m[1]]; !ok {
				t.Errorf("%s:%d: skip reason %q is not one of %s", rel, line, m[1], strings.Join(reasonNames(), ", "))
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("found no skip at all: the scan is not reading the test files")
	}
}

func reasonNames() []string {
	var r []string
	for k := range skipReasons {
		r = append(r, k)
	}
	sort.Strings(r)
	return r
}
