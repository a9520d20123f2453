package slidingratelimit

import (
	"fmt"
	"strings"
)

// maxSuggestDistance is how many edits (a letter added, dropped, changed,
// or two swapped) a misspelt name may be from the name it is taken for.
const maxSuggestDistance = 2

// didYouMean returns " (did you mean <name>?)" for the name among known
// that typed is a typo of, or "" when none is near enough. Letter case does
// not count: "Window" is window.
func didYouMean(typed string, known []string) string {
	best, bestDistance := "", maxSuggestDistance+1
	lower := strings.ToLower(typed)
	for _, name := range known {
		// A name of one or two letters is a few edits from everything.
		if d := editDistance(lower, name); d < bestDistance && d < len(typed) {
			best, bestDistance = name, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// editDistance counts the edits from a to b: a byte added, dropped or
// changed, or two adjacent bytes swapped (the optimal string alignment
// distance).
func editDistance(a, b string) int {
	// rows[k][j] is the distance from a[:i-2+k] to b[:j], for the current i.
	rows := [3][]int{make([]int, len(b)+1), make([]int, len(b)+1), make([]int, len(b)+1)}
	for j := range rows[2] {
		rows[2][j] = j
	}
	for i := 1; i <= len(a); i++ {
		rows[0], rows[1], rows[2] = rows[1], rows[2], rows[0]
		cur, prev, prev2 := rows[2], rows[1], rows[0]
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
	}
	return rows[2][len(b)]
}
