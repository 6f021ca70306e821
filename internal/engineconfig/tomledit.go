package engineconfig

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
)

// TOML files are edited as text so comments, key order and layout survive:
// the document is decoded once to learn what it means, each change is made
// as a small splice (replace one value, insert one line, insert one table
// block), and the result is decoded again and compared with the intended
// document. Only when that comparison fails (an unusual layout such as
// dotted keys or inline tables where we would add a header) is the whole
// document re-encoded, which loses comments; the change list then says so.

// tomlDoc is a decoded TOML document.
type tomlDoc = map[string]any

// decodeTOML parses data, reporting syntax errors with line and column.
func decodeTOML(data []byte) (tomlDoc, error) {
	doc := tomlDoc{}
	if err := toml.Unmarshal(data, &doc); err != nil {
		var de *toml.DecodeError
		if errors.As(err, &de) {
			row, col := de.Position()
			return nil, fmt.Errorf("%w: invalid TOML at line %d, column %d: %v: fix the syntax and run again", ErrMalformed, row, col, err)
		}
		return nil, fmt.Errorf("%w: invalid TOML: %v: fix the syntax and run again", ErrMalformed, err)
	}
	return doc, nil
}

// tomlPath renders a key path the way it would appear in a table header.
func tomlPath(path []string) string {
	parts := make([]string, len(path))
	for i, p := range path {
		parts[i] = tomlKey(p)
	}
	return strings.Join(parts, ".")
}

// tomlKey quotes a key unless it is a valid bare key.
func tomlKey(k string) string {
	if k == "" {
		return `""`
	}
	for _, r := range k {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return tomlString(k)
		}
	}
	return k
}

// tomlString renders s as a TOML basic string.
func tomlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 || r == 0x7f {
				fmt.Fprintf(&b, `\u%04X`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// tomlValue renders a value for the right-hand side of `key = value`.
// Nested tables become inline tables, which is only used for values copied
// from the user's own file (for example an array of tables in a runtime's
// options) and keeps them attached to the right key.
func tomlValue(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return tomlString(x), nil
	case bool:
		return strconv.FormatBool(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			p, err := tomlValue(e)
			if err != nil {
				return "", err
			}
			parts[i] = p
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			p, err := tomlValue(x[k])
			if err != nil {
				return "", err
			}
			parts[i] = tomlKey(k) + " = " + p
		}
		return "{" + strings.Join(parts, ", ") + "}", nil
	}
	var b bytes.Buffer
	enc := toml.NewEncoder(&b)
	enc.SetTablesInline(true)
	if err := enc.Encode(map[string]any{"v": v}); err != nil {
		return "", err
	}
	s := strings.TrimSpace(b.String())
	if !strings.HasPrefix(s, "v = ") {
		return "", fmt.Errorf("cannot render %T as a TOML value", v)
	}
	return strings.TrimPrefix(s, "v = "), nil
}

// lookup walks path through nested tables. It reports whether the value
// exists, and fails when an intermediate key holds something other than a
// table, which the engine would reject too.
func lookup(doc tomlDoc, path []string) (any, bool, error) {
	var cur any = doc
	for i, k := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false, fmt.Errorf("%w: %s is not a table: fix or remove it", ErrMalformed, tomlPath(path[:i]))
		}
		if cur, ok = m[k]; !ok {
			return nil, false, nil
		}
	}
	return cur, true, nil
}

// setIn stores value at path, creating tables on the way.
func setIn(doc tomlDoc, path []string, value any) {
	m := doc
	for _, k := range path[:len(path)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[path[len(path)-1]] = value
}

// deepCopy copies maps and slices so edits to a copied runtime entry never
// alias the original.
func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}

// tomlOp is one intended change to a TOML document.
type tomlOp struct {
	// table is the table holding key, or for a new table its own path.
	table []string
	key   string
	value any
	// newTable, when non-nil, creates the table at table with this content;
	// it is placed after the last existing table under placeAfter.
	newTable   map[string]any
	placeAfter []string
}

// applyTOMLOps returns the edited text and whether it had to be re-encoded.
func applyTOMLOps(src []byte, doc tomlDoc, ops []tomlOp) ([]byte, bool, error) {
	want := deepCopy(doc).(map[string]any)
	for _, op := range ops {
		if op.newTable != nil {
			setIn(want, op.table, deepCopy(op.newTable))
		} else {
			setIn(want, append(append([]string{}, op.table...), op.key), op.value)
		}
	}
	text := string(src)
	var err error
	for _, op := range ops {
		if op.newTable != nil {
			text, err = spliceTable(text, op.table, op.newTable, op.placeAfter)
		} else {
			text, err = spliceKey(text, op.table, op.key, op.value)
		}
		if err != nil {
			break
		}
	}
	if err == nil {
		if got, derr := decodeTOML([]byte(text)); derr == nil && sameTOML(got, want) {
			return []byte(text), false, nil
		}
	}
	// The layout defeated the splices: re-encode the intended document.
	var b bytes.Buffer
	enc := toml.NewEncoder(&b)
	enc.SetIndentTables(true)
	if err := enc.Encode(want); err != nil {
		return nil, false, fmt.Errorf("%w: cannot re-encode the configuration: %v", ErrMalformed, err)
	}
	if _, err := decodeTOML(b.Bytes()); err != nil {
		return nil, false, fmt.Errorf("re-encoded configuration does not parse (please report this): %w", err)
	}
	return b.Bytes(), true, nil
}

// sameTOML compares decoded documents; NaN equals NaN here, since a float
// value the user wrote as nan is unchanged by our edits.
func sameTOML(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !sameTOML(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !sameTOML(x[i], y[i]) {
				return false
			}
		}
		return true
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || math.IsNaN(x) && math.IsNaN(y))
	}
	return reflect.DeepEqual(a, b)
}

// stmt is one top-level statement of a TOML file: a table header or a
// key/value pair (blank lines and comments are not statements).
type stmt struct {
	header bool     // a [table] or [[array]] header
	array  bool     // an [[array]] header
	path   []string // header path, or the (dotted) key of a pair
	start  int      // offset of the first byte of the statement's first line
	end    int      // offset just past the statement's last line (after '\n')
	indent string   // whitespace before the statement
	// valStart/valEnd delimit a pair's value, without trailing comment.
	valStart, valEnd int
	multiLine        bool // the value spans lines
}

// scanTOML splits an already-valid TOML text into statements. It knows just
// enough TOML (strings of all four kinds, brackets, comments) to find where
// statements start and end.
func scanTOML(s string) ([]stmt, error) {
	var out []stmt
	i := 0
	for i < len(s) {
		lineStart := i
		for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
			i++
		}
		indent := s[lineStart:i]
		if i >= len(s) || s[i] == '\n' || s[i] == '\r' || s[i] == '#' {
			i = skipLine(s, i)
			continue
		}
		if s[i] == '[' {
			st := stmt{header: true, start: lineStart, indent: indent}
			i++
			if i < len(s) && s[i] == '[' {
				st.array = true
				i++
			}
			path, j, err := scanKey(s, i)
			if err != nil {
				return nil, err
			}
			st.path = path
			i = j
			if i >= len(s) || s[i] != ']' {
				return nil, fmt.Errorf("header at offset %d: missing ]", lineStart)
			}
			i++
			if st.array {
				if i >= len(s) || s[i] != ']' {
					return nil, fmt.Errorf("header at offset %d: missing ]]", lineStart)
				}
				i++
			}
			i = skipLine(s, i)
			st.end = i
			out = append(out, st)
			continue
		}
		st := stmt{start: lineStart, indent: indent}
		path, j, err := scanKey(s, i)
		if err != nil {
			return nil, err
		}
		st.path = path
		i = j
		if i >= len(s) || s[i] != '=' {
			return nil, fmt.Errorf("key at offset %d: missing =", lineStart)
		}
		i = skipSpace(s, i+1)
		st.valStart = i
		end, valEnd, multi, err := scanValue(s, i)
		if err != nil {
			return nil, err
		}
		st.valEnd, st.multiLine, st.end = valEnd, multi, end
		i = end
		out = append(out, st)
	}
	return out, nil
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// skipLine returns the offset just past the next newline (or len(s)).
func skipLine(s string, i int) int {
	if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
		return i + j + 1
	}
	return len(s)
}

// scanKey reads a dotted key (bare, "basic" or 'literal' parts).
func scanKey(s string, i int) ([]string, int, error) {
	var path []string
	for {
		i = skipSpace(s, i)
		if i >= len(s) {
			return nil, i, errors.New("unexpected end of file in key")
		}
		switch s[i] {
		case '"':
			j, err := scanBasicString(s, i)
			if err != nil {
				return nil, i, err
			}
			k, err := strconv.Unquote(s[i:j])
			if err != nil {
				// TOML's \U escapes have 8 digits like Go's; anything Go
				// rejects is left raw, and the final decode comparison
				// catches a mismatch.
				k = s[i+1 : j-1]
			}
			path = append(path, k)
			i = j
		case '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				return nil, i, errors.New("unterminated literal key")
			}
			path = append(path, s[i+1:i+1+j])
			i = i + 1 + j + 1
		default:
			j := i
			for j < len(s) && (s[j] >= 'A' && s[j] <= 'Z' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= '0' && s[j] <= '9' || s[j] == '_' || s[j] == '-') {
				j++
			}
			if j == i {
				return nil, i, fmt.Errorf("unexpected %q in key", s[i])
			}
			path = append(path, s[i:j])
			i = j
		}
		i = skipSpace(s, i)
		if i < len(s) && s[i] == '.' {
			i++
			continue
		}
		return path, i, nil
	}
}

// scanBasicString returns the offset just past a "..." string at s[i].
func scanBasicString(s string, i int) (int, error) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		case '\n':
			return 0, errors.New("newline in string")
		}
	}
	return 0, errors.New("unterminated string")
}

// scanValue reads a value starting at s[i] through the end of its last
// line. It returns the offset past that line, the offset past the value's
// last significant byte (before a trailing comment), and whether it
// spanned several lines.
func scanValue(s string, i int) (end, valEnd int, multi bool, err error) {
	depth := 0
	valEnd = i
	for i < len(s) {
		c := s[i]
		switch {
		case strings.HasPrefix(s[i:], `"""`) || strings.HasPrefix(s[i:], `'''`):
			q := s[i : i+3]
			j := i + 3
			for {
				k := strings.Index(s[j:], q)
				if k < 0 {
					return 0, 0, false, errors.New("unterminated multi-line string")
				}
				j += k
				if q == `"""` && escaped(s, j) {
					j++
					continue
				}
				break
			}
			j += 3
			// Up to two quote characters may end the content itself.
			for n := 0; n < 2 && j < len(s) && s[j] == q[0]; n++ {
				j++
			}
			if strings.Contains(s[i:j], "\n") {
				multi = true
			}
			i, valEnd = j, j
			continue
		case c == '"':
			j, err := scanBasicString(s, i)
			if err != nil {
				return 0, 0, false, err
			}
			i, valEnd = j, j
			continue
		case c == '\'':
			k := strings.IndexByte(s[i+1:], '\'')
			if k < 0 {
				return 0, 0, false, errors.New("unterminated literal string")
			}
			i = i + 1 + k + 1
			valEnd = i
			continue
		case c == '#':
			i = skipLine(s, i) - 1 // land on the newline (or past the end)
			if i >= len(s) || s[i] != '\n' {
				return len(s), valEnd, multi, nil
			}
			continue
		case c == '[' || c == '{':
			depth++
		case c == ']' || c == '}':
			depth--
		case c == '\n':
			if depth <= 0 {
				return i + 1, valEnd, multi, nil
			}
			multi = true
			i++
			continue
		case c == ' ' || c == '\t' || c == '\r':
			i++
			continue
		}
		i++
		valEnd = i
	}
	return len(s), valEnd, multi, nil
}

// escaped reports whether s[j] is preceded by an odd number of backslashes.
func escaped(s string, j int) bool {
	n := 0
	for k := j - 1; k >= 0 && s[k] == '\\'; k-- {
		n++
	}
	return n%2 == 1
}

func samePath(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func hasPrefix(path, prefix []string) bool {
	return len(path) >= len(prefix) && samePath(path[:len(prefix)], prefix)
}

// newline returns the line ending the file already uses.
func newline(s string) string {
	if strings.Contains(s, "\r\n") {
		return "\r\n"
	}
	return "\n"
}

// ensureTrailingNewline makes sure appended text starts on its own line.
func ensureTrailingNewline(s string) string {
	if s != "" && !strings.HasSuffix(s, "\n") {
		return s + newline(s)
	}
	return s
}

// spliceKey sets table.key = value in the text.
func spliceKey(s string, table []string, key string, value any) (string, error) {
	val, err := tomlValue(value)
	if err != nil {
		return "", err
	}
	nl := newline(s)
	stmts, err := scanTOML(s)
	if err != nil {
		return "", err
	}
	// Locate the section: the statements between the table's header and
	// the next header (for the root table, those before the first header).
	from, to, header := 0, len(stmts), -1
	if len(table) > 0 {
		for i, st := range stmts {
			if st.header && !st.array && samePath(st.path, table) {
				header, from = i, i+1
				break
			}
		}
		if header < 0 {
			// No header: add one at the end. Defining a table after its
			// sub-tables is valid TOML.
			s = ensureTrailingNewline(s)
			if s != "" {
				s += nl
			}
			return s + "[" + tomlPath(table) + "]" + nl + tomlKey(key) + " = " + val + nl, nil
		}
	}
	for i := from; i < len(stmts); i++ {
		if stmts[i].header {
			to = i
			break
		}
	}
	indent := ""
	for _, st := range stmts[from:to] {
		if samePath(st.path, []string{key}) {
			if st.multiLine {
				return "", fmt.Errorf("%s spans several lines", key)
			}
			return s[:st.valStart] + val + s[st.valEnd:], nil
		}
		if indent == "" {
			indent = st.indent
		}
	}
	if header >= 0 && indent == "" && stmts[header].indent != "" {
		indent = stmts[header].indent + "  "
	}
	line := indent + tomlKey(key) + " = " + val + nl
	switch {
	case header >= 0:
		at := stmts[header].end
		if at == len(s) && !strings.HasSuffix(s, "\n") {
			return s + nl + line, nil
		}
		return s[:at] + line + s[at:], nil
	case to > 0 && to < len(stmts):
		// A root key goes after the existing root keys...
		at := stmts[to-1].end
		return s[:at] + line + s[at:], nil
	case to < len(stmts):
		// ...or, when there are none, before the first header.
		at := stmts[to].start
		return s[:at] + line + nl + s[at:], nil
	default:
		return ensureTrailingNewline(s) + line, nil
	}
}

// spliceTable inserts a new table block after the last table under
// placeAfter, indented like its siblings.
func spliceTable(s string, path []string, content map[string]any, placeAfter []string) (string, error) {
	nl := newline(s)
	stmts, err := scanTOML(s)
	if err != nil {
		return "", err
	}
	last, sibling := -1, -1
	for i, st := range stmts {
		if !st.header || !hasPrefix(st.path, placeAfter) || len(st.path) <= len(placeAfter) {
			continue
		}
		last = i
		if sibling < 0 && len(st.path) == len(placeAfter)+1 {
			sibling = i
		}
	}
	var b strings.Builder
	if err := renderTable(&b, path, content, siblingIndents(stmts, sibling), 0, nl); err != nil {
		return "", err
	}
	block := b.String()
	if last >= 0 {
		at := len(s)
		for _, st := range stmts[last+1:] {
			if st.header {
				at = st.start
				break
			}
		}
		if at < len(s) {
			return s[:at] + block + nl + s[at:], nil
		}
	}
	s = ensureTrailingNewline(s)
	if strings.TrimSpace(s) != "" {
		s += nl
	}
	return s + block, nil
}

// indents holds the header and key indentation of one nesting level.
type indents struct{ header, key string }

// siblingIndents learns the indentation of an existing sibling table and
// its first sub-table, so an inserted block looks like its neighbours
// (containerd's generated files indent every level by two spaces; files
// written by hand often indent nothing, or only keys).
func siblingIndents(stmts []stmt, sibling int) []indents {
	if sibling < 0 {
		return nil
	}
	keyAfter := func(h int) string {
		if h+1 < len(stmts) && !stmts[h+1].header {
			return stmts[h+1].indent
		}
		return deeper(stmts[h].indent)
	}
	levels := []indents{{stmts[sibling].indent, keyAfter(sibling)}}
	for i := sibling + 1; i < len(stmts); i++ {
		st := stmts[i]
		if st.header && hasPrefix(st.path, stmts[sibling].path) && len(st.path) == len(stmts[sibling].path)+1 {
			levels = append(levels, indents{st.indent, keyAfter(i)})
			break
		}
	}
	return levels
}

// deeper is the indentation one level below ind: none stays none.
func deeper(ind string) string {
	if ind == "" {
		return ""
	}
	return ind + "  "
}

// renderTable writes a table as a header, its plain keys (sorted), then its
// sub-tables as further headers, at nesting depth level.
func renderTable(b *strings.Builder, path []string, content map[string]any, levels []indents, level int, nl string) error {
	ind := indents{}
	switch {
	case level < len(levels):
		ind = levels[level]
	case len(levels) > 0:
		prev := levels[len(levels)-1]
		for range level - len(levels) + 1 {
			prev = indents{prev.key, deeper(prev.key)}
		}
		ind = prev
	}
	b.WriteString(ind.header + "[" + tomlPath(path) + "]" + nl)
	keys := make([]string, 0, len(content))
	for k := range content {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var subs []string
	for _, k := range keys {
		if _, ok := content[k].(map[string]any); ok {
			subs = append(subs, k)
			continue
		}
		v, err := tomlValue(content[k])
		if err != nil {
			return err
		}
		b.WriteString(ind.key + tomlKey(k) + " = " + v + nl)
	}
	for _, k := range subs {
		b.WriteString(nl)
		sub := append(append([]string{}, path...), k)
		if err := renderTable(b, sub, content[k].(map[string]any), levels, level+1, nl); err != nil {
			return err
		}
	}
	return nil
}
