package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

const (
	// quietBelow is the CPU, as a share of one core over quietWindow, under
	// which the processes a phase does not measure count as quiet.
	quietBelow  = 0.03
	quietWindow = time.Second
	// quietMax bounds the wait: a host that never quiets is measured anyway
	// and the phase says so.
	quietMax = 60 * time.Second
)

// waitQuiet waits until the bench's own background work has ended: the
// containers being created or removed (containerd, shims, sandboxes),
// pools refilling, and this process and Redis idle between measurements.
// It returns what it waited for, to be printed with the measurement. Work
// of other processes on the host ("other") is reported, not waited for:
// the bench cannot stop it.
func waitQuiet(ctx context.Context) (string, error) {
	start := time.Now()
	type sample struct {
		at    time.Time
		procs procSnap
		host  time.Duration
	}
	take := func() (sample, error) {
		h, err := hostCPU()
		return sample{time.Now(), procCPU(), h}, err
	}
	prev, err := take()
	if err != nil {
		return "", err
	}
	var first string
	for {
		t := time.NewTimer(quietWindow)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-t.C:
		}
		cur, err := take()
		if err != nil {
			return "", err
		}
		secs := cur.at.Sub(prev.at).Seconds()
		share := func(d time.Duration) float64 { return d.Seconds() / secs }
		busy := map[string]float64{}
		var known time.Duration
		for name, d := range cur.procs.since(prev.procs) {
			if d > 0 {
				busy[name] += share(d)
				known += d
			}
		}
		other := share(max(cur.host-prev.host-known, 0))
		loud := false
		for _, b := range busy {
			loud = loud || b >= quietBelow
		}
		desc := describeBusy(busy, other)
		if first == "" {
			first = desc
		}
		waited := time.Since(start).Round(100 * time.Millisecond)
		switch {
		case !loud && waited <= quietWindow+quietWindow/2:
			return fmt.Sprintf("the host was quiet at once (%s)", desc), nil
		case !loud:
			return fmt.Sprintf("waited %s for the bench's background work to end (first second: %s; last: %s)", waited, first, desc), nil
		case waited >= quietMax:
			return fmt.Sprintf("NOT QUIET after %s, measured anyway (first second: %s; last: %s)", waited, first, desc), nil
		}
		prev = cur
	}
}

// describeBusy lists the busy groups, busiest first, as percent of a core.
func describeBusy(busy map[string]float64, other float64) string {
	type part struct {
		name string
		b    float64
	}
	var parts []part
	for name, b := range busy {
		if b >= 0.005 {
			parts = append(parts, part{name, b})
		}
	}
	slices.SortFunc(parts, func(a, b part) int { return cmp.Compare(b.b, a.b) })
	var sb strings.Builder
	for _, p := range parts {
		fmt.Fprintf(&sb, "%s %.0f%%, ", p.name, 100*p.b)
	}
	fmt.Fprintf(&sb, "other processes (not waited for) %.0f%% of a core", 100*other)
	return sb.String()
}
