package volume

import (
	"errors"
	"fmt"
	"regexp"
)

// MaxNameLen bounds a volume name. NBD export names may be up to 4096 bytes,
// but names become file names and URL path segments, so keep them short.
const MaxNameLen = 64

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// ErrInvalidName is wrapped by every name validation error.
var ErrInvalidName = errors.New("invalid volume name")

// ValidateName checks that name is usable as a volume (and export and file)
// name: 1 to 64 characters from [A-Za-z0-9._-], starting with a letter or
// digit, not containing "..", and not ending in one of the suffixes the
// store uses for its own files. This rules out path traversal ("../x",
// "a/b"), hidden files, and names that need quoting in a URL.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: %d characters, at most %d allowed", ErrInvalidName, len(name), MaxNameLen)
	case !nameRE.MatchString(name):
		return fmt.Errorf("%w %q: use letters, digits, '.', '_' and '-', starting with a letter or digit", ErrInvalidName, name)
	case containsDotDot(name):
		return fmt.Errorf("%w %q: must not contain \"..\"", ErrInvalidName, name)
	case hasReservedSuffix(name):
		return fmt.Errorf("%w %q: must not end in %q, %q or %q", ErrInvalidName, name, rawExt, metaExt, stateExt)
	}
	return nil
}

func containsDotDot(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '.' && s[i+1] == '.' {
			return true
		}
	}
	return false
}

func hasReservedSuffix(s string) bool {
	for _, suf := range []string{rawExt, metaExt, stateExt} {
		if len(s) >= len(suf) && s[len(s)-len(suf):] == suf {
			return true
		}
	}
	return false
}
