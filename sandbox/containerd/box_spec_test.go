package containerd

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// A box binds the job filter and the jail library read-only, the library
// without noexec (the zygote maps it), each from the host path given; any
// other sandbox gets neither.
func TestBoxMountsBindTheJail(t *testing.T) {
	t.Parallel()
	spec := func() *oci.Spec {
		return &oci.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}, Mounts: []specs.Mount{{Destination: "/proc", Type: "proc", Options: []string{"ro"}}}}
	}
	s := spec()
	if err := WithBoxMounts("/host/ctl.sock", "/host/job.bpf", "/host/libkilnjail.so")(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	byDest := map[string]specs.Mount{}
	for _, m := range s.Mounts {
		byDest[m.Destination] = m
	}
	for _, c := range []struct {
		dest, src string
		noexec    bool
	}{{BoxFilterPath, "/host/job.bpf", true}, {BoxJailPath, "/host/libkilnjail.so", false}, {BoxSocketPath, "/host/ctl.sock", true}} {
		m, ok := byDest[c.dest]
		if !ok || m.Source != c.src {
			t.Errorf("%s: %+v; want a bind of %s", c.dest, m, c.src)
			continue
		}
		if slices.Contains(m.Options, "noexec") != c.noexec {
			t.Errorf("%s: options %v; noexec wanted %v", c.dest, m.Options, c.noexec)
		}
		if c.dest != BoxSocketPath && !slices.Contains(m.Options, "ro") {
			t.Errorf("%s: options %v; want read-only", c.dest, m.Options)
		}
	}
	other := spec()
	if err := WithBoxMounts("", "/host/job.bpf", "/host/libkilnjail.so")(context.Background(), nil, nil, other); err != nil || len(other.Mounts) != 1 {
		t.Errorf("a sandbox that is no box: mounts %v, %v", other.Mounts, err)
	}
}
