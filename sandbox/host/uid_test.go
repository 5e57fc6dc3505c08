package host

import (
	"testing"
)

// Sandbox uids are drawn at random among the free ones: the uid a job gets
// says nothing of how many jobs (another tenant's) came before it. Each uid
// is held by one sandbox at a time.
func TestUIDPoolRandomAndExclusive(t *testing.T) {
	t.Parallel()
	p := NewUIDPool(200_000, 1000, t.TempDir())
	held := map[int]bool{}
	prev, consecutive := -1, 0
	for range 40 {
		uid, err := p.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		if held[uid] || uid < 200_000 || uid >= 201_000 {
			t.Fatalf("uid %d handed out twice or outside the range", uid)
		}
		held[uid] = true
		if uid == prev+1 {
			consecutive++
		}
		prev = uid
	}
	if consecutive > 10 {
		t.Errorf("%d of 40 uids followed the one before: handed out in order", consecutive)
	}
	small := NewUIDPool(300_000, 2, t.TempDir())
	a, _ := small.Acquire()
	b, _ := small.Acquire()
	if _, err := small.Acquire(); err == nil || a == b {
		t.Fatalf("a full pool handed out a third uid (%d, %d)", a, b)
	}
	small.Release(a)
	if c, err := small.Acquire(); err != nil || c != a {
		t.Fatalf("after release: %d %v; want %d again", c, err, a)
	}
}
