package cli

import "strings"

// closest returns the candidate a mistyped word most likely meant, or ""
// when none is near: the only candidate the word begins ("gantry -v":
// version), else the one at the smallest edit distance (insertions,
// deletions, substitutions and swaps of neighbours), within 1 for words of
// up to 3 letters and 2 for longer ones ("generat": generate, "lsit":
// list). Dashes before a flag's name are not counted.
func closest(word string, candidates []string) string {
	w := strings.ToLower(strings.TrimLeft(word, "-"))
	if w == "" {
		return ""
	}
	var prefixed []string
	for _, c := range candidates {
		if strings.HasPrefix(strings.TrimLeft(c, "-"), w) {
			prefixed = append(prefixed, c)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	limit := 1
	if len(w) > 3 {
		limit = 2
	}
	best, bestDist, tie := "", limit+1, false
	for _, c := range candidates {
		d := editDistance(w, strings.TrimLeft(c, "-"))
		switch {
		case d < bestDist:
			best, bestDist, tie = c, d, false
		case d == bestDist:
			tie = true
		}
	}
	if tie {
		return ""
	}
	return best
}

// editDistance is the optimal string alignment distance of a and b.
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

// didYouMean is ` (did you mean "S"?)` for the closest candidate, or "".
func didYouMean(word string, candidates []string) string {
	if c := closest(word, candidates); c != "" {
		return ` (did you mean "` + c + `"?)`
	}
	return ""
}
