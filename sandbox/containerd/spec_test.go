package containerd

import (
	"slices"
	"testing"
)

// A sandbox's thread pools default to its CPU quota, rounded up; a runtime
// profile that sets the variable itself keeps its own, and a sandbox
// without a quota gets no default.
func TestThreadsFollowTheCPUQuota(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cpus    float64
		profile []string
		want    []string
	}{
		{1, nil, []string{"OMP_NUM_THREADS=1"}},
		{0.25, nil, []string{"OMP_NUM_THREADS=1"}},
		{1.5, []string{"PYTHONHASHSEED=0"}, []string{"OMP_NUM_THREADS=2"}},
		{4, []string{"OMP_NUM_THREADS=8"}, nil},
		{0, nil, nil},
	} {
		if got := threadsEnv(c.cpus, c.profile); !slices.Equal(got, c.want) {
			t.Errorf("threadsEnv(%v, %v) = %v; want %v", c.cpus, c.profile, got, c.want)
		}
	}
}
