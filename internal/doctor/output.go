package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// WriteJSON writes the results as a JSON array of objects with the keys
// check, subject, status, evidence and fix (always all five, in Run's
// order), followed by a newline.
func WriteJSON(w io.Writer, rs []Result) error {
	if rs == nil {
		rs = []Result{}
	}
	b, err := json.MarshalIndent(rs, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Summary counts the results per status: "21 ok, 3 warn, 1 fail".
func Summary(rs []Result) string {
	n := map[Status]int{}
	for _, r := range rs {
		n[r.Status]++
	}
	return fmt.Sprintf("%d ok, %d warn, %d fail", n[OK], n[Warn], n[Fail])
}

// DefaultWidth is the table width when the output is not a terminal.
const DefaultWidth = 160

// WriteTable writes the results as an aligned table (CHECK, SUBJECT,
// STATUS, EVIDENCE, FIX) no wider than width columns where the words
// allow (width <= 0: DefaultWidth), evidence and fix wrapped side by side,
// then the summary line.
func WriteTable(w io.Writer, rs []Result, width int) error {
	if width <= 0 {
		width = DefaultWidth
	}
	const gap = 2
	cw, sw := len("CHECK"), len("SUBJECT")
	for _, r := range rs {
		cw = max(cw, utf8.RuneCountInString(r.Check))
		sw = max(sw, utf8.RuneCountInString(r.Subject))
	}
	sw = min(sw, 28) // long paths wrap within their column
	stw := len("STATUS")
	rest := width - cw - sw - stw - 4*gap
	ew := max(rest*11/20, 20)
	fw := max(rest-ew, 20)
	var b strings.Builder
	row := func(cols [5][]string) {
		n := 1
		for _, c := range cols {
			n = max(n, len(c))
		}
		widths := [5]int{cw, sw, stw, ew, fw}
		for i := 0; i < n; i++ {
			var line strings.Builder
			for j, c := range cols {
				cell := ""
				if i < len(c) {
					cell = c[i]
				}
				if j == 4 {
					line.WriteString(cell)
					break
				}
				line.WriteString(cell)
				line.WriteString(strings.Repeat(" ", widths[j]-utf8.RuneCountInString(cell)+gap))
			}
			b.WriteString(strings.TrimRight(line.String(), " "))
			b.WriteByte('\n')
		}
	}
	row([5][]string{{"CHECK"}, {"SUBJECT"}, {"STATUS"}, {"EVIDENCE"}, {"FIX"}})
	for _, r := range rs {
		row([5][]string{{r.Check}, wrap(r.Subject, sw), {string(r.Status)}, wrap(r.Evidence, ew), wrap(r.Fix, fw)})
	}
	b.WriteString(Summary(rs))
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

// wrap breaks s into lines of at most width runes at spaces; a word
// longer than width is cut.
func wrap(s string, width int) []string {
	if s == "" {
		return nil
	}
	width = max(width, 1) // a zero width would never make progress
	var lines []string
	var cur []rune
	for _, word := range strings.Fields(s) {
		wr := []rune(word)
		for len(wr) > width {
			if len(cur) > 0 {
				lines = append(lines, string(cur))
				cur = nil
			}
			lines = append(lines, string(wr[:width]))
			wr = wr[width:]
		}
		switch {
		case len(cur) == 0:
			cur = wr
		case len(cur)+1+len(wr) <= width:
			cur = append(append(cur, ' '), wr...)
		default:
			lines = append(lines, string(cur))
			cur = wr
		}
	}
	if len(cur) > 0 {
		lines = append(lines, string(cur))
	}
	return lines
}
