package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox"
)

const (
	rowBareLoop = "bare python3 loop (chroot)"
	rowDirect   = "box sandbox.Run (in-process)"
)

// tally is one row of the saturation phase, summed over its rounds.
type tally struct {
	name  string
	jobs  int
	busy  time.Duration            // wall time its rounds ran
	cpu   time.Duration            // the host's CPU over its rounds
	procs map[string]time.Duration // that CPU by process group
	lat   []time.Duration
	boxes sandbox.BoxStats // the box path's counters over its rounds
}

func (t *tally) rate() float64 { return float64(t.jobs) / t.busy.Seconds() }

// perJob is the host's CPU per job, in ms.
func (t *tally) perJob() float64 { return t.cpu.Seconds() * 1000 / float64(t.jobs) }

func (t *tally) split() string {
	line := fmt.Sprintf("    %s: %s", t.name, cpuSplit(t.procs, t.cpu, t.jobs))
	if b := t.boxes; b.Hits+b.Claims+b.Misses > 0 {
		line += fmt.Sprintf("; boxes: %d hits, %d claims, %d misses, %d retired, %d made ahead", b.Hits, b.Claims, b.Misses, b.Retired, b.Prepared)
	}
	return line
}

// round runs n jobs at concurrency conc and adds them to t: the host's CPU
// from the first job until the paths are quiet again (what a path does
// after its last result, removals and the pool's refill, is its cost too,
// and must not land on the next round). It starts quiet as well: the first
// round of a section would otherwise share the host with what came before
// it (pools filling, boxes being made at start-up), and be charged for it.
func (ps *paths) round(ctx context.Context, t *tally, conc, n int, run func(ctx context.Context) error) error {
	if err := ps.quiesce(ctx); err != nil {
		return err
	}
	procs0, box0 := procCPU(), ps.box.sb.BoxStats()
	cpu0, err := hostCPU()
	if err != nil {
		return err
	}
	start := time.Now()
	_, lat, err := jobsAt(ctx, conc, n, run)
	if err != nil {
		return fmt.Errorf("%s: %w", t.name, err)
	}
	t.busy += time.Since(start)
	if err := ps.quiesce(ctx); err != nil {
		return err
	}
	cpu1, err := hostCPU()
	if err != nil {
		return err
	}
	procs1, box1 := procCPU(), ps.box.sb.BoxStats()
	t.jobs += n
	t.cpu += cpu1 - cpu0
	t.lat = append(t.lat, lat...)
	if t.procs == nil {
		t.procs = map[string]time.Duration{}
	}
	for k, v := range procs1.since(procs0) {
		t.procs[k] += v
	}
	t.boxes.Hits += box1.Hits - box0.Hits
	t.boxes.Claims += box1.Claims - box0.Claims
	t.boxes.Misses += box1.Misses - box0.Misses
	t.boxes.Retired += box1.Retired - box0.Retired
	t.boxes.Prepared += box1.Prepared - box0.Prepared
	return nil
}

func (t *tally) print() {
	if t.jobs == 0 {
		return
	}
	fmt.Printf("  %-34s %10.2f %11.1f ms %10s %10s\n", t.name, t.rate(), t.perJob(), ms(quantile(t.lat, 0.5)), ms(quantile(t.lat, 0.99)))
}

// saturate runs jobs at concurrency = cores on every path and on the bare
// interpreter, and prints jobs per second and host CPU per job.
//
// The box path through the API and the same boxes called in-process, whose
// difference is the pipeline's own CPU, run in alternating rounds
// (o.SaturationRounds of them, o.SaturationBoxJobs jobs in all each): a
// drift in the host's speed over the phase (another tenant of the VM, the
// page cache, the sandboxes' own spread) then lands on both rows alike,
// not on whichever ran in the slower minute.
func (ps *paths) saturate(ctx context.Context, o *options) error {
	if ps.pooled == nil || o.SaturationJobs <= 0 {
		return nil
	}
	conc := runtime.NumCPU()
	n := o.SaturationJobs
	body, err := json.Marshal(job.Spec{Runtime: "python", Code: o.Code, Cache: job.CacheOff()})
	if err != nil {
		return err
	}
	fmt.Printf("\nsaturation: %d jobs of %q at concurrency %d (= cores), cache off; the two box rows %d jobs each, in %d alternating rounds\n",
		n, o.Code, conc, o.SaturationBoxJobs, o.SaturationRounds)
	fmt.Printf("  %-34s %10s %14s %10s %10s\n", "path", "jobs/s", "CPU per job", "p50", "p99")
	got := map[string]*tally{}
	var order []string
	tallyOf := func(name string) *tally {
		if got[name] == nil {
			got[name] = &tally{name: name}
			order = append(order, name)
		}
		return got[name]
	}
	want := []byte{}
	bare := tallyOf(rowBareLoop)
	if err := ps.round(ctx, bare, conc, n, func(ctx context.Context) error {
		return runCmd(ctx, &want, "chroot", ps.rootfs, "python3", "-c", o.Code)
	}); err != nil {
		return err
	}
	bare.print()
	viaAPI := func(p *pipeline) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			res, err := p.submitWait(ctx, body)
			if err == nil && res.Status != job.StatusSucceeded {
				err = fmt.Errorf("job %s: %s", res.ID, res.Status)
			}
			return err
		}
	}
	for _, p := range []*pipeline{ps.before, ps.fresh, ps.pooled} {
		t := tallyOf(p.name)
		if err := ps.round(ctx, t, conc, n, viaAPI(p)); err != nil {
			return err
		}
		t.print()
	}
	// One box per slot, as the tenant's stream of jobs leaves after its
	// first jobs.
	if err := ps.warmBoxes(ctx, o, conc); err != nil {
		return err
	}
	if err := ps.quiesce(ctx); err != nil {
		return err
	}
	// The same boxes called in-process, as the worker calls them: what the
	// sandbox path costs without the API and the queue.
	spec := job.Spec{Runtime: "python", Code: o.Code, Cache: job.CacheOff()}
	direct := func(ctx context.Context) error {
		res, err := ps.box.sb.Run(ctx, sandbox.Request{ID: job.NewID(), Spec: spec, Tenant: "kiln-bench"})
		if err == nil && res.Status != job.StatusSucceeded {
			err = fmt.Errorf("job %s: %s", res.ID, res.Status)
		}
		return err
	}
	boxRow, directRow := tallyOf(rowBox), tallyOf(rowDirect)
	rounds := max(o.SaturationRounds, 1)
	for i := range rounds {
		// Jobs spread over the rounds, the first ones taking the remainder.
		k := o.SaturationBoxJobs / rounds
		if i < o.SaturationBoxJobs%rounds {
			k++
		}
		if k == 0 {
			continue
		}
		// The first round of the API row is profiled (-cpuprofile, -memprofile).
		stop := func() {}
		if i == 0 {
			if stop, err = startProfiles(o.CPUProfile, o.MemProfile, ""); err != nil {
				return err
			}
		}
		err := ps.round(ctx, boxRow, conc, k, viaAPI(ps.box))
		stop()
		if err != nil {
			return err
		}
		if err := ps.round(ctx, directRow, conc, k, direct); err != nil {
			return err
		}
	}
	boxRow.print()
	directRow.print()
	before, fresh := got[rowBefore], got[rowFresh]
	if before.jobs > 0 {
		r := fresh.perJob() / before.perJob()
		fmt.Printf("  %-52s %6.2f×  target ≤ %.2f×  %s\n", "fresh CPU per job / before's", r, freshCPUTarget, mark(r <= freshCPUTarget))
	}
	if bare.jobs > 0 && boxRow.jobs > 0 && directRow.jobs > 0 {
		fmt.Printf("  %-52s %6.2f×\n", "pooled throughput / bare interpreter loop", got[rowPooled].rate()/bare.rate())
		r := boxRow.rate() / bare.rate()
		fmt.Printf("  %-52s %6.2f×  target ≥ %.2f×  %s\n", "box (default) throughput / bare interpreter loop", r, boxTarget, mark(r >= boxTarget))
		c := boxRow.perJob() / bare.perJob()
		fmt.Printf("  %-52s %6.2f×  target ≤ %.2f×  %s\n", "box (default) CPU per job / bare loop's", c, boxCPUTarget, mark(c <= boxCPUTarget))
		fmt.Printf("  %-52s %6.2f×\n", "box in-process throughput / bare loop", directRow.rate()/bare.rate())
		fmt.Printf("  %-52s %6.2f×\n", "box in-process CPU per job / bare loop's", directRow.perJob()/bare.perJob())
		// The pipeline's own CPU per job has the bound of its added latency.
		p, target := boxRow.perJob()-directRow.perJob(), float64(overheadTarget)/float64(time.Millisecond)
		fmt.Printf("  %-52s %6.1f ms  target ≤ %.0f ms  %s\n", "pipeline CPU per box job (e2e − in-process)", p, target, mark(p <= target))
	}
	if err := ps.tenantRows(ctx, o, conc, bare); err != nil {
		return err
	}
	fmt.Println("  where each path's CPU per job went (by process):")
	for _, name := range order {
		if got[name].jobs > 0 {
			fmt.Println(got[name].split())
		}
	}
	fmt.Println("  at saturation every slot is busy, so the pool does not refill (a refill costs a cold job's CPU):")
	fmt.Println("  pooled throughput is cold throughput; the pool buys latency while the host has spare CPU")
	return nil
}
