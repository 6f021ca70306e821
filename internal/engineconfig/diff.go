package engineconfig

import (
	"fmt"
	"strings"
)

// diffContext is the number of unchanged lines shown around each change,
// as diff -u does.
const diffContext = 3

// maxDiffCells bounds the quadratic line matcher; beyond it the differing
// middle is shown as one replacement, which is still a correct diff.
const maxDiffCells = 4 << 20

type diffLine struct {
	op   byte // ' ', '-' or '+'
	text string
	// noEOL: this is the last line of its file and lacks a newline.
	noEOL bool
}

// splitLines splits text into lines without their '\n', and reports
// whether the final line lacks one.
func splitLines(s string) ([]string, bool) {
	if s == "" {
		return nil, false
	}
	noEOL := !strings.HasSuffix(s, "\n")
	s = strings.TrimSuffix(s, "\n")
	return strings.Split(s, "\n"), noEOL
}

// unifiedDiff renders the difference between a and b in unified format
// with the given file labels; "" when they are equal.
func unifiedDiff(fromName, toName string, a, b []byte) string {
	if string(a) == string(b) {
		return ""
	}
	al, aNoEOL := splitLines(string(a))
	bl, bNoEOL := splitLines(string(b))
	script := diffScript(al, bl)
	// Mark the final line of each side when it has no newline; a line that
	// is equal in text but differs in that respect becomes a change.
	var fixed []diffLine
	ai, bi := 0, 0
	for _, d := range script {
		switch d.op {
		case ' ':
			aLast := aNoEOL && ai == len(al)-1
			bLast := bNoEOL && bi == len(bl)-1
			if aLast != bLast {
				fixed = append(fixed, diffLine{'-', d.text, aLast}, diffLine{'+', d.text, bLast})
			} else {
				fixed = append(fixed, diffLine{' ', d.text, aLast})
			}
			ai++
			bi++
		case '-':
			fixed = append(fixed, diffLine{'-', d.text, aNoEOL && ai == len(al)-1})
			ai++
		case '+':
			fixed = append(fixed, diffLine{'+', d.text, bNoEOL && bi == len(bl)-1})
			bi++
		}
	}

	var out strings.Builder
	fmt.Fprintf(&out, "--- %s\n+++ %s\n", fromName, toName)
	// Walk the script, emitting hunks around runs of changes.
	n := len(fixed)
	i := 0
	aLine, bLine := 1, 1 // line numbers at fixed[i]
	for i < n {
		if fixed[i].op == ' ' {
			aLine++
			bLine++
			i++
			continue
		}
		// Start the hunk diffContext lines before this change.
		start := i
		for start > 0 && i-start < diffContext && fixed[start-1].op == ' ' {
			start--
		}
		hA, hB := aLine-(i-start), bLine-(i-start)
		// Extend to the end of the last change that is within
		// 2*diffContext unchanged lines of the previous one.
		end := i
		for j := i; j < n; {
			if fixed[j].op != ' ' {
				j++
				end = j
				continue
			}
			k := j
			for k < n && fixed[k].op == ' ' {
				k++
			}
			if k == n || k-j > 2*diffContext {
				break
			}
			j = k
		}
		stop := end
		for stop < n && stop-end < diffContext && fixed[stop].op == ' ' {
			stop++
		}
		var countA, countB int
		for _, d := range fixed[start:stop] {
			if d.op != '+' {
				countA++
			}
			if d.op != '-' {
				countB++
			}
		}
		fmt.Fprintf(&out, "@@ -%s +%s @@\n", hunkRange(hA, countA), hunkRange(hB, countB))
		for _, d := range fixed[start:stop] {
			out.WriteByte(d.op)
			out.WriteString(d.text)
			out.WriteByte('\n')
			if d.noEOL {
				out.WriteString("\\ No newline at end of file\n")
			}
		}
		for _, d := range fixed[i:stop] {
			if d.op != '+' {
				aLine++
			}
			if d.op != '-' {
				bLine++
			}
		}
		i = stop
	}
	return out.String()
}

// hunkRange formats "start,count" the way diff -u does (an empty range
// names the line before it).
func hunkRange(start, count int) string {
	if count == 0 {
		start--
	}
	if count == 1 {
		return fmt.Sprint(start)
	}
	return fmt.Sprintf("%d,%d", start, count)
}

// diffScript returns a shortest edit script turning a into b: common prefix
// and suffix first (edits to config files are local), then a longest-common-
// subsequence table over the rest.
func diffScript(a, b []string) []diffLine {
	var script []diffLine
	p := 0
	for p < len(a) && p < len(b) && a[p] == b[p] {
		script = append(script, diffLine{op: ' ', text: a[p]})
		p++
	}
	sa, sb := len(a), len(b)
	for sa > p && sb > p && a[sa-1] == b[sb-1] {
		sa--
		sb--
	}
	ma, mb := a[p:sa], b[p:sb]
	if len(ma)*len(mb) > maxDiffCells {
		for _, l := range ma {
			script = append(script, diffLine{op: '-', text: l})
		}
		for _, l := range mb {
			script = append(script, diffLine{op: '+', text: l})
		}
	} else {
		// lcs[i][j]: length of the LCS of ma[i:] and mb[j:].
		w := len(mb) + 1
		lcs := make([]int, (len(ma)+1)*w)
		for i := len(ma) - 1; i >= 0; i-- {
			for j := len(mb) - 1; j >= 0; j-- {
				if ma[i] == mb[j] {
					lcs[i*w+j] = lcs[(i+1)*w+j+1] + 1
				} else {
					lcs[i*w+j] = max(lcs[(i+1)*w+j], lcs[i*w+j+1])
				}
			}
		}
		i, j := 0, 0
		for i < len(ma) || j < len(mb) {
			switch {
			case i < len(ma) && j < len(mb) && ma[i] == mb[j]:
				script = append(script, diffLine{op: ' ', text: ma[i]})
				i++
				j++
			case j == len(mb) || (i < len(ma) && lcs[(i+1)*w+j] >= lcs[i*w+j+1]):
				// Prefer deleting first, so a replaced line reads as -old +new.
				script = append(script, diffLine{op: '-', text: ma[i]})
				i++
			default:
				script = append(script, diffLine{op: '+', text: mb[j]})
				j++
			}
		}
	}
	for k := sa; k < len(a); k++ {
		script = append(script, diffLine{op: ' ', text: a[k]})
	}
	return script
}
