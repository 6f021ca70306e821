package legacyapi

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"
)

func str(p *string) string {
	if p == nil || *p == "" {
		return "N/A"
	}
	return *p
}

func num[T uint | uint64](p *T, unit string) string {
	if p == nil {
		return "N/A"
	}
	return fmt.Sprintf("%d%s", *p, unit)
}

// text lays out "Label:  value" rows as the original's tabwriter did: the
// values of a run of rows are aligned two spaces after the run's longest
// label, and a line without a value (a heading, a blank line) ends the run.
type text struct {
	w    io.Writer
	rows []textRow
}

type textRow struct {
	label, value string
	heading      bool
}

func newText(w io.Writer) *text {
	if rw, ok := w.(http.ResponseWriter); ok {
		rw.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	return &text{w: w}
}

// row adds "label: value". The value is printable: a process's name comes
// from its argv[0], which a container's process sets as it likes, and a
// newline in it would forge rows of the text.
func (t *text) row(label, value string) {
	t.rows = append(t.rows, textRow{label: label, value: printable(value)})
}

// printable replaces control characters and invalid UTF-8 with '?'.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == utf8.RuneError || unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}

// line is a row without a value.
func (t *text) line(s string) { t.rows = append(t.rows, textRow{label: s, heading: true}) }

func (t *text) flush() {
	var b strings.Builder
	for start := 0; start < len(t.rows); {
		if t.rows[start].heading {
			b.WriteString(t.rows[start].label + "\n")
			start++
			continue
		}
		end, width := start, 0
		for ; end < len(t.rows) && !t.rows[end].heading; end++ {
			width = max(width, utf8.RuneCountInString(t.rows[end].label))
		}
		for _, r := range t.rows[start:end] {
			fmt.Fprintf(&b, "%-*s  %s\n", width, r.label, r.value)
		}
		start = end
	}
	io.WriteString(t.w, b.String())
}
