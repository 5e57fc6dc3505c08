package containerd

import "testing"

func TestContainerdEOL(t *testing.T) {
	for v, want := range map[string]bool{
		"v1.6.20": true, "1.6.20~ds1": true, "v1.5.0": true, "v0.2.0": true,
		"v1.7.35": false, "v2.1.0": false, "v1.7.0-rc.1": false, "unknown": false,
	} {
		if got := eol(v); got != want {
			t.Errorf("eol(%q) = %v, want %v", v, got, want)
		}
	}
}
