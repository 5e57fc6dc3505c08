package queue

import "testing"

func TestOlderThan(t *testing.T) {
	for v, want := range map[string]bool{
		"2.9.10": true, "2.9.25": true, "2.10.0": false, "2.10.0-beta.1": false, "2.15.2": false, "3.0.0": false, "v2.11.1": false, "1.4.1": true,
	} {
		if got := olderThan(v, MinServerVersion); got != want {
			t.Errorf("olderThan(%q, %q) = %v, want %v", v, MinServerVersion, got, want)
		}
	}
}
