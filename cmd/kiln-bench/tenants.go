package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kilnrun/kiln/job"
)

// tenantCounts are the tenant rows: the box path through the API with jobs
// taken from that many tenants in turn.
var tenantCounts = []int{1, 20, 200}

// Targets of the tenant rows, as ratios measured in the same run.
const (
	tenants20Target   = 0.9 // 20 tenants' throughput / 1 tenant's
	tenants200Target  = 0.8 // 200 tenants' throughput / 1 tenant's
	tenantsP50Target  = 1.3 // p50 of 20 or 200 tenants / 1 tenant's
	oneTenantTarget   = 1.0 // 1 tenant's throughput / the bare interpreter loop's
	manyTenantsTarget = 0.5 // the one-job-each run's throughput / 1 tenant's
)

func tenantRowName(n int) string { return fmt.Sprintf("box, %d tenants in turn", n) }

// tenantRows measures the default path as the number of tenants grows: the
// rows of tenantCounts and the bare interpreter loop in alternating rounds
// (o.TenantJobs jobs each), then o.ManyTenants tenants submitting one job
// each. It prints throughput, CPU per job and p50 with the targets, and the
// queue's JetStream consumers before and after.
func (ps *paths) tenantRows(ctx context.Context, o *options, conc int, bareRow *tally) error {
	if o.TenantJobs <= 0 && o.ManyTenants <= 0 {
		return nil
	}
	body, err := json.Marshal(job.Spec{Runtime: "python", Code: o.Code, Cache: job.CacheOff()})
	if err != nil {
		return err
	}
	before, err := ps.box.consumers(ctx)
	if err != nil {
		return err
	}
	submit := func(key string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			res, err := ps.box.submitWaitAs(ctx, key, body)
			if err == nil && res.Status != job.StatusSucceeded {
				err = fmt.Errorf("job %s: %s", res.ID, res.Status)
			}
			return err
		}
	}
	inTurn := func(n int) func(ctx context.Context) error {
		var next atomic.Int64
		return func(ctx context.Context) error {
			return submit(ps.box.keys[int(next.Add(1)-1)%n])(ctx)
		}
	}
	bare := &tally{name: rowBareLoop}
	rows := make([]*tally, len(tenantCounts))
	if o.TenantJobs > 0 {
		fmt.Printf("\ntenants: the box path through the API, %d jobs of %q per row at concurrency %d, cache off, jobs taken from N tenants in turn;\n  %d alternating rounds with the bare interpreter loop\n",
			o.TenantJobs, o.Code, conc, max(o.SaturationRounds, 1))
		fmt.Printf("  %-34s %10s %14s %10s %10s\n", "row", "jobs/s", "CPU per job", "p50", "p99")
		want := []byte{}
		for i, n := range tenantCounts {
			rows[i] = &tally{name: tenantRowName(n)}
		}
		rounds := max(o.SaturationRounds, 1)
		turns := make([]func(ctx context.Context) error, len(tenantCounts))
		for i, n := range tenantCounts {
			turns[i] = inTurn(n)
		}
		for r := range rounds {
			k := o.TenantJobs / rounds
			if r < o.TenantJobs%rounds {
				k++
			}
			if k == 0 {
				continue
			}
			if err := ps.round(ctx, bare, conc, k, func(ctx context.Context) error {
				return runCmd(ctx, &want, "chroot", ps.rootfs, "python3", "-c", o.Code)
			}); err != nil {
				return err
			}
			for i := range tenantCounts {
				if err := ps.round(ctx, rows[i], conc, k, turns[i]); err != nil {
					return err
				}
			}
		}
		bare.print()
		for _, t := range rows {
			t.print()
		}
		one := rows[0]
		ratioLine := func(name string, r, target float64, atLeast bool) {
			ok := r <= target
			rel := "≤"
			if atLeast {
				ok, rel = r >= target, "≥"
			}
			fmt.Printf("  %-52s %6.2f×  target %s %.2f×  %s\n", name, r, rel, target, mark(ok))
		}
		ratioLine("1 tenant throughput / bare interpreter loop", one.rate()/bare.rate(), oneTenantTarget, true)
		for i, n := range tenantCounts[1:] {
			t := rows[i+1]
			target := tenants20Target
			if n >= 200 {
				target = tenants200Target
			}
			ratioLine(fmt.Sprintf("%d tenants throughput / 1 tenant's", n), t.rate()/one.rate(), target, true)
			ratioLine(fmt.Sprintf("%d tenants p50 / 1 tenant's", n), float64(quantile(t.lat, 0.5))/float64(quantile(one.lat, 0.5)), tenantsP50Target, false)
		}
		if bareRow != nil && bareRow.jobs > 0 {
			fmt.Printf("  (the bare loop's first round, before the box rows: %.1f jobs/s)\n", bareRow.rate())
		}
		for _, t := range rows {
			fmt.Println(t.split())
		}
	}
	if o.ManyTenants > 0 {
		many := &tally{name: fmt.Sprintf("box, %d tenants one job each", o.ManyTenants)}
		var next atomic.Int64
		u0, err := ps.box.usageNow(ctx)
		if err != nil {
			return err
		}
		if err := ps.round(ctx, many, conc, o.ManyTenants, func(ctx context.Context) error {
			// Tenants from the second on: the first ran the rows above.
			return submit(ps.box.keys[1+int(next.Add(1)-1)%(len(ps.box.keys)-1)])(ctx)
		}); err != nil {
			return err
		}
		u1, err := ps.box.usageNow(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("\n  %-34s %10s %14s %10s %10s\n", "row", "jobs/s", "CPU per job", "p50", "p99")
		many.print()
		if one := rows[0]; one != nil && one.jobs > 0 {
			r := many.rate() / one.rate()
			fmt.Printf("  %-52s %6.2f×  target ≥ %.2f×  %s\n", fmt.Sprintf("%d tenants one job each / 1 tenant throughput", o.ManyTenants), r, manyTenantsTarget, mark(r >= manyTenantsTarget))
		}
		fmt.Println(many.split())
		printPerJob(u0, u1, o.ManyTenants)
		st := ps.box.sb.BoxStats()
		fmt.Printf("  boxes now: %d idle and %d neutral holding %.1f MiB (%.1f MiB each), %d live\n", st.Idle, st.Neutral,
			float64(st.IdleMemory)/(1<<20), float64(st.IdleMemory)/(1<<20)/float64(max(st.Idle+st.Neutral, 1)), st.Live)
	}
	after, err := ps.box.consumers(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("  JetStream consumers of the queue: %v before the tenant rows (one tenant had run), %v after\n", before, after)
	return nil
}

// consumers counts the consumers of the job and ready streams.
func (p *pipeline) consumers(ctx context.Context) (map[string]int, error) {
	nc, err := nats.Connect(p.natsURL, nats.Name("kiln-bench-observer"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, name := range []string{job.StreamName, job.ReadyStreamName} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		names := s.ConsumerNames(ctx)
		for range names.Name() {
			out[name]++
		}
		if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
			return nil, err
		}
	}
	return out, nil
}
