package worker

import "testing"

// A worker takes a session only while it fits: under Max, and within
// MemoryBytes and the tenant's share of it, counting every session held or
// being opened by the memory it may use (its memory_mb), not by what its
// box holds now.
func TestSessionRoomCountsDeclaredMemory(t *testing.T) {
	h := &sessionHost{cfg: SessionConfig{Max: 10, MemoryBytes: 4 << 30}.withDefaults(), live: map[string]*liveSession{}, opening: map[string]sessionClaim{}}
	if h.cfg.TenantMemoryBytes != 2<<30 {
		t.Fatalf("a tenant's share defaults to %d, want half of 4 GiB", h.cfg.TenantMemoryBytes)
	}
	gib := func(tenant string) sessionClaim { return claimOf(tenant, 1024) }
	if ok, full := h.room(gib("alice")); !ok || full {
		t.Fatal("an empty worker has no room")
	}
	h.opening["a1"] = gib("alice")
	h.opening["a2"] = gib("alice")
	if ok, full := h.room(gib("alice")); ok || !full {
		t.Fatalf("alice's third 1 GiB session: room %v, tenant full %v; want refused for her share", ok, full)
	}
	if ok, full := h.room(gib("bob")); !ok || full {
		t.Fatal("bob refused while alice holds only her share")
	}
	h.opening["b1"] = gib("bob")
	h.opening["b2"] = gib("bob")
	if ok, full := h.room(gib("carol")); ok || full {
		t.Fatalf("a session past MemoryBytes: room %v, tenant full %v; want no room, not the tenant's share", ok, full)
	}
	h.cfg.MemoryBytes = 100 << 30
	h.cfg.Max = 4
	if ok, _ := h.room(gib("carol")); ok {
		t.Fatal("a session was given room past Max")
	}
	h.cfg.Max = 10
	h.stopped = true
	if ok, _ := h.room(gib("carol")); ok {
		t.Fatal("a stopping worker took a session")
	}
	if d := (SessionConfig{}).withDefaults(); d.Max != SessionsMaxDefault || d.MemoryBytes != SessionsMemoryDefault || d.TenantMemoryBytes != SessionsMemoryDefault/2 {
		t.Fatalf("defaults %+v", d)
	}
}
