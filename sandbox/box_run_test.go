package sandbox

import (
	"math/rand/v2"
	"testing"
)

// A box's inner sandboxes never take the uid of the one before them: two
// jobs in a row (of one tenant or, in a neutral box, of two) are two uids,
// each of the others as likely.
func TestJobUIDNeverRepeats(t *testing.T) {
	t.Parallel()
	span := boxJobUIDMax - boxJobUIDMin
	for _, last := range []int{0, boxJobUIDMin, boxJobUIDMin + 1, 30000, boxJobUIDMax - 2, boxJobUIDMax - 1} {
		seen, drawn := map[int]bool{}, map[int]bool{}
		for _, draw := range []int{0, 1, last - boxJobUIDMin - 1, last - boxJobUIDMin, last - boxJobUIDMin + 1, span - 2} {
			if draw < 0 || draw > span-2 || drawn[draw] {
				continue
			}
			drawn[draw] = true
			uid := jobUID(last, func(n int) int {
				if n != span-1 {
					t.Fatalf("drawn among %d uids; want %d (all but the last)", n, span-1)
				}
				return draw
			})
			if uid == last || uid < boxJobUIDMin || uid >= boxJobUIDMax || seen[uid] {
				t.Errorf("last %d, draw %d: uid %d; want another uid of the range, one per draw", last, draw, uid)
			}
			seen[uid] = true
		}
	}
	last := 0
	for range 10000 {
		uid := jobUID(last, rand.IntN)
		if uid == last {
			t.Fatalf("uid %d twice in a row", uid)
		}
		last = uid
	}
}
