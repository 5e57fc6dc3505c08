package callback

import "testing"

// A name is forgotten at the second sweep running that finds nothing of it,
// never while something of it is parked or sent, nor right after it was
// seen again.
func TestSeenNamesForgetIdleNames(t *testing.T) {
	var n seenNames
	n.store("a", "tenant-a")
	n.store("b", "tenant-b")
	busy := map[string]bool{"a": true}
	keep := func(k, _ string) bool { return busy[k] }
	n.sweep(keep)
	if _, ok := n.load("b"); !ok {
		t.Fatal("b forgotten at its first idle sweep")
	}
	n.sweep(keep)
	if _, ok := n.load("b"); ok {
		t.Fatal("b kept after two idle sweeps")
	}
	if v, ok := n.load("a"); !ok || v != "tenant-a" {
		t.Fatalf("a, busy, forgotten: %q %v", v, ok)
	}
	busy["a"] = false
	n.sweep(keep)            // a idle once
	n.store("a", "tenant-a") // seen again
	n.sweep(keep)
	if _, ok := n.load("a"); !ok {
		t.Fatal("a forgotten right after it was seen again")
	}
	n.sweep(keep)
	if n.len() != 0 {
		t.Fatalf("%d names left", n.len())
	}
}
