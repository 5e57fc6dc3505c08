package worker

import "testing"

// A worker takes a session only while it fits: under Max, and within
// MemoryBytes counting each held or opening session at least as the floor.
func TestSessionRoomCountsMemoryAndMax(t *testing.T) {
	h := &sessionHost{cfg: SessionConfig{Max: 3, MemoryBytes: 3 * sessionMemoryFloor}.withDefaults(), live: map[string]*liveSession{}}
	if !h.room() {
		t.Fatal("an empty worker has no room")
	}
	h.live["a"] = &liveSession{}
	h.opening = 1
	if got := h.memoryInUse(); got != 2*sessionMemoryFloor {
		t.Fatalf("memoryInUse = %d, want two floors (%d)", got, 2*sessionMemoryFloor)
	}
	if !h.room() {
		t.Fatal("a third session fits the memory and Max but was refused")
	}
	h.live["b"] = &liveSession{}
	if h.room() {
		t.Fatal("a fourth session was given room past MemoryBytes and Max")
	}
	h.cfg.Max = 10
	if h.room() {
		t.Fatal("a session was given room past MemoryBytes")
	}
	h.cfg.MemoryBytes = 10 * sessionMemoryFloor
	if !h.room() {
		t.Fatal("room refused with Max and memory to spare")
	}
	h.stopped = true
	if h.room() {
		t.Fatal("a stopping worker took a session")
	}
	if d := (SessionConfig{}).withDefaults(); d.Max != SessionsMaxDefault || d.MemoryBytes != SessionsMemoryDefault {
		t.Fatalf("defaults %+v", d)
	}
}
