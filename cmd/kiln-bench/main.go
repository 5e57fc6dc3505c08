package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// row is one thing measured: Run performs one complete run.
type row struct {
	Name string
	Run  func(ctx context.Context) error
}

// ratio is printed as Num / Den when both rows ran.
type ratio struct{ Num, Den string }

// section prepares a group of rows.
type section struct {
	Name string
	// Order places the section's rows, reports and phase among the others
	// (ascending). Registration follows file names, which is not the order
	// a reader wants. A section is cleaned up once done: one without a
	// phase before the first phase runs, one with a phase after it.
	Order  int
	Setup  func(ctx context.Context, o *options) (rows []row, cleanup func(), err error)
	Ratios []ratio
	// Report, when set, runs after the measurement to print extra detail.
	// medians holds the median of every row that ran, by row name.
	Report func(ctx context.Context, o *options, medians map[string]time.Duration)
	// Phase, when set, runs after every report: measurements of its own
	// that are not single runs of a row (load, rates). It prints its own table.
	Phase func(ctx context.Context, o *options) error
}

// options are the command-line flags every section can read.
type options struct {
	N       int
	Only    string // sections to measure; "" is all
	Code    string
	Verbose bool
	Spans   bool

	Pipeline          bool          // measure the pipeline section at all
	ThroughputJobs    int           // jobs per concurrency level of the throughput phase
	ThroughputConc    []int         // client concurrency levels of the throughput phase
	CacheClients      int           // concurrent clients of the cache-hit rate phase
	CacheTime         time.Duration // length of each cache-hit measurement
	SaturationJobs    int           // jobs per path of the saturation phase (paths section)
	SaturationBoxJobs int           // jobs of each box row (API, in-process) of the saturation phase
	SaturationRounds  int           // alternating rounds the box rows' jobs are spread over
	TenantJobs        int           // jobs of each tenant row (1, 20, 200 tenants in turn)
	ManyTenants       int           // tenants of the one-job-each run
	AgentMixReps      int           // runs of each agent-mix program on each side (agentmix section; 0: skip)
	CPUProfile        string        // where to write this process's CPU profiles (box path at saturation; cache hits)
	MemProfile        string        // where to write this process's allocation profiles (box path at saturation; cache hits)
}

var sections []section

func register(s section) { sections = append(sections, s) }

func main() {
	var o options
	flag.IntVar(&o.N, "n", 30, "runs per row")
	flag.StringVar(&o.Only, "only", "", "comma-separated sections to measure (sandbox, runtimes, pipeline, ...); default: all")
	flag.StringVar(&o.Code, "code", "print(1)", "the Python program every row runs")
	flag.BoolVar(&o.Verbose, "v", false, "print every run's time")
	flag.BoolVar(&o.Spans, "spans", false, "also break the in-process sandbox run down by span")
	flag.BoolVar(&o.Pipeline, "pipeline", true, "also measure the pipeline: HTTP API → JetStream → worker → Redis (needs redis-server)")
	flag.IntVar(&o.ThroughputJobs, "throughput-jobs", 96, "jobs per concurrency level of the pipeline throughput phase (0: skip the phase)")
	o.ThroughputConc = []int{2, 8, 32}
	flag.Func("throughput-conc", "comma-separated client concurrency levels of the throughput phase (default 2,8,32)", func(v string) error {
		o.ThroughputConc = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("%q is not a positive whole number", f)
			}
			o.ThroughputConc = append(o.ThroughputConc, n)
		}
		return nil
	})
	flag.IntVar(&o.CacheClients, "cache-clients", 16, "concurrent clients of the cache-hit rate measurement")
	flag.IntVar(&o.SaturationJobs, "saturation-jobs", 200, "jobs per sandbox path at concurrency = cores in the paths section's saturation phase (0: skip)")
	flag.IntVar(&o.SaturationBoxJobs, "saturation-box-jobs", 1000, "jobs of the box path through the API, and of the same boxes in-process, in the saturation phase (the pipeline's CPU is their difference)")
	flag.IntVar(&o.SaturationRounds, "saturation-rounds", 5, "alternating rounds (API, in-process, API, ...) the box rows' saturation jobs are spread over")
	flag.IntVar(&o.TenantJobs, "tenant-jobs", 600, "jobs of each tenant row of the saturation phase (the box path through the API, jobs taken from 1, 20 and 200 tenants in turn; 0: skip the tenant rows)")
	flag.IntVar(&o.ManyTenants, "many-tenants", 3000, "tenants of the saturation phase's one-job-each run (0: skip it)")
	flag.IntVar(&o.AgentMixReps, "agent-mix-reps", 3, "runs of each program of the agent mix on each side (box through the API, cold chrooted interpreter; 0: skip the agentmix section)")
	flag.StringVar(&o.CPUProfile, "cpuprofile", "", "write CPU profiles of this process (API, queue and worker) to this file during the box path's first round through the API at saturation, and to file.cache during the many-client cache-hit measurement (go tool pprof)")
	flag.StringVar(&o.MemProfile, "memprofile", "", "write this process's allocation profiles, as -cpuprofile its CPU profiles: to this file after the box path's first round through the API at saturation and to file.cache after the many-client cache-hit measurement, each with its base (file.base, file.cache.base) taken before it (go tool pprof -sample_index=alloc_space -base file.base file)")
	flag.DurationVar(&o.CacheTime, "cache-time", 3*time.Second, "length of each cache-hit measurement (0: skip them)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal cancels ctx and clean-up runs; a second one kills at once.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, &o); err != nil {
		fmt.Fprintln(os.Stderr, "kiln-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o *options) error {
	slices.SortStableFunc(sections, func(a, b section) int { return cmp.Compare(a.Order, b.Order) })
	active := sections
	if o.Only != "" {
		active = slices.DeleteFunc(slices.Clone(sections), func(s section) bool { return !slices.Contains(strings.Split(o.Only, ","), s.Name) })
	}
	var rows []row
	var ratios []ratio
	// cleanups[i] undoes active[i]'s setup. A section is cleaned up as soon
	// as it is done (after the reports, or after its phase), so what it
	// keeps running (pools, boxes, its worker) is gone before the phases
	// that follow; whatever is left when run returns is cleaned up then.
	cleanups := make([]func(), len(active))
	cleanUp := func(i int) {
		if c := cleanups[i]; c != nil {
			cleanups[i] = nil
			c()
		}
	}
	defer func() {
		for i := len(active) - 1; i >= 0; i-- {
			cleanUp(i)
		}
	}()
	for i, s := range active {
		rs, cleanup, err := s.Setup(ctx, o)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
		cleanups[i] = cleanup
		rows = append(rows, rs...)
		ratios = append(ratios, s.Ratios...)
	}
	// One unmeasured run each: page cache, image resolution, binary start.
	for _, r := range rows {
		if err := r.Run(ctx); err != nil {
			return fmt.Errorf("%s (warm-up): %w", r.Name, err)
		}
	}
	samples := make([][]time.Duration, len(rows))
	// Each round runs every row once, in an order of its own: what a row
	// leaves running in the background (a removal, a pool's refill) then
	// lands on a different row each round instead of always on the same
	// neighbour. The order is seeded, so a run can be repeated.
	order := make([]int, len(rows))
	for j := range order {
		order[j] = j
	}
	shuffle := rand.New(rand.NewPCG(1, 2))
	for i := range o.N {
		shuffle.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		for _, j := range order {
			r := rows[j]
			start := time.Now()
			if err := r.Run(ctx); err != nil {
				return fmt.Errorf("%s (run %d): %w", r.Name, i+1, err)
			}
			d := time.Since(start)
			samples[j] = append(samples[j], d)
			if o.Verbose {
				fmt.Fprintf(os.Stderr, "%-28s run %3d  %s\n", r.Name, i+1, d.Round(time.Microsecond))
			}
		}
	}
	medians := map[string]time.Duration{}
	fmt.Printf("%d runs each of %q\n\n%-28s %10s %10s\n", o.N, o.Code, "row", "median", "p99")
	for j, r := range rows {
		med, p99 := quantile(samples[j], 0.5), quantile(samples[j], 0.99)
		medians[r.Name] = med
		fmt.Printf("%-28s %10s %10s\n", r.Name, ms(med), ms(p99))
	}
	fmt.Println()
	width := 0
	for _, q := range ratios {
		width = max(width, len(q.Num+" / "+q.Den+" (median)"))
	}
	for _, q := range ratios {
		n, okN := medians[q.Num]
		d, okD := medians[q.Den]
		if okN && okD && d > 0 {
			fmt.Printf("%-*s %6.2f×\n", width, q.Num+" / "+q.Den+" (median)", float64(n)/float64(d))
		}
	}
	for _, s := range active {
		if s.Report != nil {
			s.Report(ctx, o, medians)
		}
	}
	for i := len(active) - 1; i >= 0; i-- {
		if active[i].Phase == nil {
			cleanUp(i)
		}
	}
	for i, s := range active {
		if s.Phase != nil {
			if err := s.Phase(ctx, o); err != nil {
				return fmt.Errorf("%s: %w", s.Name, err)
			}
			cleanUp(i)
		}
	}
	return nil
}

// quantile returns the q-quantile by nearest rank.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
