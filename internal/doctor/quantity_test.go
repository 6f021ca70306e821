package doctor

import "testing"

// The API server writes extended resource counts as canonical quantities:
// 1000 time-sliced replicas come back as "1k".
func TestWholeQuantity(t *testing.T) {
	for q, want := range map[string]int64{"0": 0, "8": 8, "1k": 1000, "2M": 2_000_000, "1Ki": 1024, "3e3": 3000, "16": 16} {
		if got, err := wholeQuantity(q); err != nil || got != want {
			t.Errorf("wholeQuantity(%q) = %d, %v; want %d", q, got, err, want)
		}
	}
	for _, q := range []string{"", "k", "1.5", "-1", "1m", "500m", "abc", "1e", "1e-3", "10E", "99999999999999999999"} {
		if got, err := wholeQuantity(q); err == nil {
			t.Errorf("wholeQuantity(%q) = %d, want an error", q, got)
		}
	}
}
