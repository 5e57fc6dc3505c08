package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

// The sandbox paths, each end to end through its own API, queue and worker:
// the fresh path as it was (removal before the reply, a shim per sandbox),
// the fresh path now, and the warm pool.
const (
	rowBefore       = "e2e cold fresh, before"
	rowFresh        = "e2e cold fresh"
	rowPooled       = "e2e pooled fresh"
	rowBox          = "e2e box (default)"
	rowPandasCold   = "pandas, cold"
	rowPandasPooled = "pandas, preloaded"
)

// pandasCode is the heavy-import job of the preload comparison.
const pandasCode = "import pandas; print(pandas.__version__)"

// Targets of the paths section, as ratios measured in the same run.
const (
	pooledVsBareTarget = 1.0 // pooled print(1) e2e median / chrooted interpreter median
	pandasTarget       = 0.1 // preloaded pandas / cold pandas
	freshCPUTarget     = 0.5 // fresh CPU per job / before's
	boxTarget          = 0.7 // box throughput / bare interpreter loop at concurrency = cores
	boxCPUTarget       = 1.5 // box machine CPU per job / bare interpreter loop's
)

func init() {
	ps := &paths{}
	register(section{
		Name:  "paths",
		Order: 3,
		Setup: ps.setup,
		Ratios: []ratio{
			{rowPooled, rowBare}, {rowBox, rowBare}, {rowFresh, rowBare}, {rowFresh, rowBefore},
			{rowPandasPooled, rowPandasCold},
		},
		Report: ps.report,
		Phase:  ps.saturate,
	})
}

type paths struct {
	before, fresh, pooled, box *pipeline
	rootfs                     string
}

func (ps *paths) setup(ctx context.Context, o *options) ([]row, func(), error) {
	if !o.Pipeline {
		return nil, nil, nil
	}
	rootfs, err := imageRootfs()
	if err != nil {
		return nil, nil, err
	}
	ps.rootfs = rootfs
	ps.before = &pipeline{name: rowBefore, tweak: func(c *sandbox.Config) {
		c.Boxes.Off = true
		c.CleanupBeforeReply, c.ShimGroupSize = true, 1
	}}
	ps.fresh = &pipeline{name: rowFresh, tweak: func(c *sandbox.Config) { c.Boxes.Off = true }}
	ps.pooled = &pipeline{name: rowPooled, tweak: func(c *sandbox.Config) {
		// Two pooled rows a round (print and pandas), refilled while the
		// other rows run. Its sandboxes preload numpy and pandas, what the
		// pandas row measures: with the image's whole agent list a refill
		// takes about 2 s of CPU, and two a round leave the pool empty
		// for most of the rows.
		c.Pool = sandbox.PoolConfig{Max: 3, Min: 3, Preload: map[string][]string{"python": {"numpy", "pandas"}}}
		c.Boxes.Off = true
	}}
	// The default configuration: every python job in a fresh inner
	// sandbox of a box.
	ps.box = &pipeline{name: rowBox, tenants: max(o.ManyTenants, tenantCounts[len(tenantCounts)-1])}
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	var rows []row
	for _, p := range []*pipeline{ps.before, ps.fresh, ps.pooled, ps.box} {
		rs, c, err := p.setup(ctx, o)
		if err != nil {
			cleanup()
			return nil, nil, fmt.Errorf("%s: %w", p.name, err)
		}
		cleanups = append(cleanups, c)
		rows = append(rows, rs...)
	}
	pandas, err := json.Marshal(job.Spec{Runtime: "python", Code: pandasCode, Cache: job.CacheOff()})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	rows = append(rows,
		row{rowPandasCold, func(ctx context.Context) error { return ps.fresh.e2e(ctx, pandas) }},
		row{rowPandasPooled, func(ctx context.Context) error { return ps.pooled.e2e(ctx, pandas) }},
	)
	// The pool fills, and the tenant's first job claims a box, before the
	// first measurement.
	if err := awaitIdle(ctx, ps.pooled.sb, 3); err != nil {
		cleanup()
		return nil, nil, err
	}
	if err := ps.warmBoxes(ctx, o, 1); err != nil {
		cleanup()
		return nil, nil, err
	}
	return rows, cleanup, nil
}

// warmBoxes runs jobs on the box pipeline until n of the bench tenant's
// boxes wait for the next one.
func (ps *paths) warmBoxes(ctx context.Context, o *options, n int) error {
	body, err := json.Marshal(job.Spec{Runtime: "python", Code: o.Code, Cache: job.CacheOff()})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for ps.box.sb.BoxStats().Idle < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("no idle box within 2 minutes: %+v", ps.box.sb.BoxStats())
		}
		if err := fanOut(ctx, n, func(ctx context.Context) error { _, err := ps.box.submitWait(ctx, body); return err }); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
	}
	return nil
}

// awaitIdle waits until the python pool holds n idle sandboxes.
func awaitIdle(ctx context.Context, sb *sandbox.Containerd, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		for _, s := range sb.PoolStats() {
			if s.Runtime == "python" && s.Idle >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pool did not fill within 2 minutes: %+v", sb.PoolStats())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// report prints the targets met or missed, and the pool's hit count and
// memory.
func (ps *paths) report(_ context.Context, _ *options, medians map[string]time.Duration) {
	if ps.pooled == nil {
		return
	}
	fmt.Println("\nsandbox paths (targets as ratios from this run)")
	ratioLine := func(name string, num, den string, target float64) {
		n, okN := medians[num]
		d, okD := medians[den]
		if !okN || !okD || d == 0 {
			fmt.Printf("  %-52s not measured (run the %q rows too)\n", name, den)
			return
		}
		r := float64(n) / float64(d)
		fmt.Printf("  %-52s %6.2f×  target ≤ %.2f×  %s\n", name, r, target, mark(r <= target))
	}
	ratioLine("pooled print(1) e2e / chrooted interpreter", rowPooled, rowBare, pooledVsBareTarget)
	ratioLine("box (default) print(1) e2e / chrooted interpreter", rowBox, rowBare, pooledVsBareTarget)
	ratioLine("pandas preloaded / pandas cold", rowPandasPooled, rowPandasCold, pandasTarget)
	st := ps.box.sb.BoxStats()
	fmt.Printf("  boxes: hits %d, claims %d, misses %d, retired %d, live %d; sandboxes made ahead of their job %d, discarded %d\n", st.Hits, st.Claims, st.Misses, st.Retired, st.Live, st.Prepared, st.Discarded)
	for _, s := range ps.pooled.sb.PoolStats() {
		fmt.Printf("  pool %-12s hits %d, misses %d, unfit %d, refills %d (mean %s), idle %d holding %.1f MiB (%.1f MiB each)\n",
			s.Runtime, s.Hits, s.Misses, s.Unfit, s.Refills, ms(meanOf(s.RefillTime, s.Refills)), s.Idle,
			float64(s.MemoryBytes)/(1<<20), float64(s.MemoryBytes)/(1<<20)/float64(max(s.Idle, 1)))
	}
}

func meanOf(d time.Duration, n int64) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

// quiesce waits until no path is still busy from the row before: every
// removal done, and the pooled path's pool refilled (a refill is a whole
// container with pandas imported: measured beside the next row, it was
// charged to that row, the box path's CPU per job rising by about 4 ms).
func (ps *paths) quiesce(ctx context.Context) error {
	for _, p := range []*pipeline{ps.before, ps.fresh, ps.pooled, ps.box} {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := p.sb.Settle(sctx)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: settle: %w", p.name, err)
		}
	}
	return awaitIdle(ctx, ps.pooled.sb, 3)
}

// hostCPU is the CPU time the whole host has spent busy so far, from
// /proc/stat (every state but idle and iowait).
func hostCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy int64
	for i, v := range f[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 8 { // guest time is already in user
			break
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		busy += n
	}
	return time.Duration(busy) * 10 * time.Millisecond, nil
}
