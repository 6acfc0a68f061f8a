package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// Config file errors in the file's own words. The YAML decoder's messages
// name Go types ("cannot unmarshal !!str `lots` into int64", "field lisen
// not found in type config.TLS"); a person editing vmsan.yaml needs the key
// as written, the line, what the value should look like and, for a typo,
// the key meant. checkYAML walks the parsed document against the Config
// struct (keys from the yaml tags) before the real decode and reports
// every problem it finds that way; the decoder then only sees documents
// that passed.

// LineError is one problem at a line of the config file.
type LineError struct {
	Line int
	Msg  string
}

// FileErrors are the problems found in one config file; Error formats them
// "line N: ..." one per line, and Load prefixes each with the file name
// ("vmsan.yaml:12: ...").
type FileErrors struct {
	File string // "" when parsing bytes (Parse)
	Errs []LineError
}

func (e *FileErrors) Error() string {
	lines := make([]string, len(e.Errs))
	for i, le := range e.Errs {
		if e.File != "" {
			lines[i] = fmt.Sprintf("%s:%d: %s", e.File, le.Line, le.Msg)
		} else {
			lines[i] = fmt.Sprintf("line %d: %s", le.Line, le.Msg)
		}
	}
	return strings.Join(lines, "\n")
}

var (
	sizeType        = reflect.TypeOf(Size(0))
	durationType    = reflect.TypeOf(Duration(0))
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
)

// checkYAML returns the problems in b as *FileErrors, or nil. A document
// that is not YAML at all is left to the decoder (its syntax errors
// already name the line and say what is wrong).
func checkYAML(b []byte) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil || len(doc.Content) == 0 {
		return nil
	}
	var errs []LineError
	checkNode(doc.Content[0], reflect.TypeOf(Config{}), "", "", &errs)
	if len(errs) == 0 {
		return nil
	}
	return &FileErrors{Errs: errs}
}

// checkNode checks n against type t. key is the key n is the value of
// (for messages), section the enclosing section's path ("" at top level).
func checkNode(n *yaml.Node, t reflect.Type, key, section string, errs *[]LineError) {
	add := func(line int, f string, a ...any) { *errs = append(*errs, LineError{line, fmt.Sprintf(f, a...)}) }
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if isNull(n) {
		return // an empty value leaves the default
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	what := "the file"
	if key != "" {
		what = fmt.Sprintf("%q", key)
	}
	switch {
	case t == sizeType, t == durationType:
		ok := n.Kind == yaml.ScalarNode && n.Decode(reflect.New(t).Interface()) == nil
		if !ok {
			if t == sizeType {
				add(n.Line, "%s must be a size like 32M or 20G, got %s", what, shown(n))
			} else {
				add(n.Line, "%s must be a duration like 100us, 5ms or 2s, got %s", what, shown(n))
			}
		}
	case t.Kind() == reflect.Struct && n.Kind == yaml.ScalarNode && reflect.PointerTo(t).Implements(unmarshalerType):
		// A section with a short scalar form (iscsi.listen's "HOST:PORT"
		// for {addr: HOST:PORT}): its own decoder says whether it fits.
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			add(n.Line, "%s: %v", what, err)
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			add(n.Line, "%s must be a section of key: value lines, got %s", what, shown(n))
			return
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			ft, ok := fields[k.Value]
			if !ok {
				add(k.Line, "unknown key %q%s%s", k.Value, inSection(section), suggest(k.Value, fields))
				continue
			}
			checkNode(v, ft, k.Value, join(section, k.Value), errs)
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			example := "[a, b]"
			if t.Elem().Kind() == reflect.Struct {
				example = "a list of \"- name: ...\" entries"
			}
			add(n.Line, "%s must be a list (%s), got %s", what, example, shown(n))
			return
		}
		for _, e := range n.Content {
			checkNode(e, t.Elem(), key, section, errs)
		}
	default: // scalars: string, bool, integers
		if n.Kind != yaml.ScalarNode || n.Decode(reflect.New(t).Interface()) != nil {
			add(n.Line, "%s must be %s, got %s", what, scalarWant(t), shown(n))
		}
	}
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

func scalarWant(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.String:
		return "a single value (quote it if it contains : or #)"
	}
	return "a " + t.Kind().String()
}

// shown renders a value for a message: scalars quoted, collections by kind.
func shown(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	case yaml.MappingNode:
		return "a section (key: value lines)"
	case yaml.SequenceNode:
		return "a list"
	}
	return "something else"
}

func inSection(section string) string {
	if section == "" {
		return ""
	}
	return fmt.Sprintf(" in section %q", section)
}

func join(section, key string) string {
	if section == "" {
		return key
	}
	return section + "." + key
}

// yamlFields maps a struct's YAML keys to their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		m[name] = f.Type
	}
	return m
}

// suggest is ` (did you mean "listen"?)` for the closest known key when
// it is close enough to be a typo, else the list of valid keys.
func suggest(k string, fields map[string]reflect.Type) string {
	keys := make([]string, 0, len(fields))
	for f := range fields {
		keys = append(keys, f)
	}
	sort.Strings(keys)
	best, bestD := "", 1<<30
	for _, f := range keys {
		if d := editDistance(strings.ToLower(k), f); d < bestD {
			best, bestD = f, d
		}
	}
	// A typo: a couple of edits, fewer than half the key's letters.
	if best != "" && bestD <= 2 && bestD*2 < len(best) {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return " (valid keys: " + strings.Join(keys, ", ") + ")"
}

// editDistance is the Damerau-Levenshtein distance (optimal string
// alignment: a swap of two adjacent letters counts as one edit).
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
