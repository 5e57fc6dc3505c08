package main

import (
	"testing"
	"unicode/utf8"
)

// A write to a command's stdin is cut between characters: wholeRunes
// keeps back only the start of a character its bytes end inside of.
func TestWholeRunes(t *testing.T) {
	euro := "€" // three bytes
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0},
		{"abc", 3},
		{"a" + euro, 4},
		{"a" + euro[:1], 1},
		{"a" + euro[:2], 1},
		{"ab\xff", 3}, // not UTF-8: kept, for the caller to refuse
		{euro + euro + euro[:2], 6},
	} {
		got := wholeRunes([]byte(tc.in))
		if got != tc.want {
			t.Errorf("wholeRunes(%q) = %d, want %d", tc.in, got, tc.want)
		}
		if tc.in != "ab\xff" && !utf8.ValidString(tc.in[:got]) {
			t.Errorf("wholeRunes(%q) keeps %q, not whole characters", tc.in, tc.in[:got])
		}
	}
}
