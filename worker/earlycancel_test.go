package worker

import (
	"fmt"
	"testing"
	"time"
)

// A cancel that found nothing running is taken once by the call it names
// within earlyCancelKeep, never after; what is kept is bounded in count.
func TestEarlyCancels(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	var e earlyCancels
	e.note("a", t0)
	e.note("b", t0.Add(time.Second))
	if !e.take("a", t0.Add(30*time.Second)) {
		t.Fatal("a cancel 30 s old was not taken")
	}
	if e.take("a", t0.Add(31*time.Second)) {
		t.Fatal("a cancel was taken twice")
	}
	if e.take("b", t0.Add(time.Second+earlyCancelKeep)) {
		t.Fatal("a cancel older than earlyCancelKeep was taken")
	}
	if e.take("never", t0) {
		t.Fatal("an id never canceled was taken")
	}
	// Old ones go as new ones come; the count stays bounded.
	for i := range 3 * earlyCancelMax {
		e.note(fmt.Sprint(i), t0.Add(2*time.Minute))
	}
	if len(e.at) > earlyCancelMax || len(e.order) > earlyCancelMax {
		t.Fatalf("%d ids kept (%d in order); want at most %d", len(e.at), len(e.order), earlyCancelMax)
	}
	if !e.take(fmt.Sprint(3*earlyCancelMax-1), t0.Add(2*time.Minute)) {
		t.Fatal("the newest cancel was dropped")
	}
	// The same id noted again after it was taken: the new note stands
	// when the old one is dropped.
	e.note("again", t0.Add(3*time.Minute))
	e.take("again", t0.Add(3*time.Minute))
	e.note("again", t0.Add(3*time.Minute+50*time.Second))
	e.note("push", t0.Add(4*time.Minute+10*time.Second)) // drops the old notes
	if !e.take("again", t0.Add(4*time.Minute+10*time.Second)) {
		t.Fatal("a second note of an id was dropped with its first")
	}
	e.note("late", t0.Add(10*time.Minute))
	if len(e.at) != 1 {
		t.Fatalf("%d ids kept after their minute; want the new one alone", len(e.at))
	}
}
