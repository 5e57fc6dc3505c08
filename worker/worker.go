package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
)

// Worker consumes jobs for every runtime its Runtime offers.
type Worker struct {
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	host   string // host.name on spans
	js     jetstream.JetStream

	slots chan struct{} // a token per free slot
	busy  atomic.Int64

	// The parts, made by New, each owning its state (doc.go).
	storeWatch *storeWatch    // the store's retries: pull nothing new while it is unreachable
	backend    *backendState  // the sandbox backend: pull nothing new while it is down
	owner      *ownership     // the worker id's lease; reaping what dead workers left
	registry   *registrar     // this worker's runtimes in the registry
	cancels    *cancels       // what runs here, for cancels by request
	results    *recorder      // records what jobs came to
	objects    *objectStore   // artifacts, long output and specs sent by reference
	audit      *auditLog      // the tenants' audit logs
	egress     *egressProxies // each run's network
	probes     *writeProbes   // whether JetStream's stores take writes
	advisories *advisories    // jobs whose deliveries ran out

	startOnce sync.Once
	tasks     tasks // goroutines NATS handlers start; Run waits for them
	ready     readiness
}

// errForcedDrain is the cancel cause when the drain grace period runs out.
var errForcedDrain = errors.New("worker drain timeout")

// New checks cfg and returns a worker; Run starts it.
func New(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	js, err := jetstream.New(cfg.NATS)
	if err != nil {
		return nil, fmt.Errorf("worker: jetstream: %w", err)
	}
	w := &Worker{
		cfg:    cfg,
		log:    cfg.Logger.With(slog.String("worker", cfg.ID)),
		tracer: cfg.TracerProvider.Tracer("github.com/kilnrun/kiln/worker"),
		js:     js,
		slots:  make(chan struct{}, cfg.Concurrency),
	}
	w.storeWatch = newStoreWatch(&w.cfg, w.log)
	w.backend = newBackendState(cfg.Runtime, w.log, cfg.SandboxProbe)
	w.audit = &auditLog{js: js, store: cfg.Store, clock: cfg.Clock}
	w.egress = &egressProxies{testHosts: cfg.EgressTestHosts}
	w.objects = newObjectStore(&w.cfg, w.log, js, &w.ready)
	w.results = &recorder{store: cfg.Store, sw: w.storeWatch, audit: w.audit, nc: cfg.NATS, js: js, queue: cfg.Queue,
		clock: cfg.Clock, tracer: w.tracer, hooks: cfg.Hooks, metrics: cfg.Metrics}
	w.cancels = newCancels(cfg.Clock, w.log)
	w.owner = newOwnership(&w.cfg, w.log, w.storeWatch, &w.tasks, w.cancels.runs)
	w.registry = &registrar{rt: cfg.Runtime, store: cfg.Store, clock: cfg.Clock, every: cfg.RegistryInterval,
		probe: cfg.StoreProbe, log: w.log, hooks: cfg.Hooks, sessions: w.takesSessions}
	w.advisories = &advisories{nc: cfg.NATS, js: js, log: w.log, tasks: &w.tasks, results: w.results, metrics: cfg.Metrics}
	w.probes = &writeProbes{every: cfg.WriteProbe, queue: cfg.Queue, js: js, ready: &w.ready, log: w.log, objects: w.objects}
	for range cfg.Concurrency {
		w.slots <- struct{}{}
	}
	w.host, _ = os.Hostname()
	return w, nil
}

// Busy is the number of jobs running now.
func (w *Worker) Busy() int { return int(w.busy.Load()) }

// Run consumes jobs until ctx is cancelled, then drains: it pulls nothing
// new, lets running jobs finish within DrainTimeout, and returns. A second
// call returns an error.
//
// Run returns only once every goroutine it started has ended, whatever the
// path out: each step pushes what undoes it on one stack, run last first
// as Run returns. The id's lease outlives everything else (it is held until
// the drain is over); the loops end with ctx or an early return; the jobs
// end with the drain.
func (w *Worker) Run(ctx context.Context) error {
	started := false
	w.startOnce.Do(func() { started = true })
	if !started {
		return errors.New("worker: Run called twice")
	}
	var undo runUndo
	defer undo.run()
	if err := w.takeID(ctx, &undo); err != nil {
		return err
	}
	consumers, err := w.startRuntime(ctx)
	if err != nil {
		return err
	}
	if err := w.subscribe(ctx, &undo); err != nil {
		return err
	}
	run, err := w.startLoops(ctx, &undo, consumers)
	if err != nil {
		return err
	}
	w.log.InfoContext(ctx, "worker started", slog.Int("slots", w.cfg.Concurrency), slog.Any("runtimes", w.cfg.Runtime.Runtimes()))
	<-ctx.Done()
	w.drain(run)
	return nil
}

// runUndo is what Run's steps undo as it returns, last pushed first.
type runUndo []func()

func (u *runUndo) push(f func()) { *u = append(*u, f) }

// run undoes every step pushed so far (a pointer: Run defers it before
// any step is pushed).
func (u *runUndo) run() {
	for i := len(*u) - 1; i >= 0; i-- {
		(*u)[i]()
	}
}

// takeID takes the worker's id in the store and holds its lease until Run
// returns; then (pushed second, so run first) waits for the tasks the
// subscriptions' handlers started. Start-up survives dependencies that are
// down: every step retries with back-off until it succeeds or ctx ends,
// and Readiness says which one is being waited for.
func (w *Worker) takeID(ctx context.Context, undo *runUndo) error {
	w.ready.set(checkStore, "waiting: taking the worker id in the store")
	w.ready.set(checkWrites, "waiting: not probed yet")
	if err := w.owner.acquire(ctx); err != nil {
		w.ready.set(checkStore, err.Error())
		return err
	}
	w.ready.set(checkStore, okCheck)
	var idGroup errgroup.Group
	idCtx, stopID := context.WithCancel(context.WithoutCancel(ctx))
	idGroup.Go(func() error { w.owner.hold(idCtx); return nil })
	undo.push(func() { stopID(); _ = idGroup.Wait() })
	// Pushed before the subscriptions' Unsubscribe, so it runs after them:
	// no handler starts a task once it waits.
	undo.push(w.tasks.wait)
	return nil
}

// startRuntime reaps what a predecessor left, starts the runtime's own
// background work (the warm pool: once the worker holds its id and has
// reaped), and sets up the queue's consumers (by runtime), the job I/O and
// the first write probe.
func (w *Worker) startRuntime(ctx context.Context) (map[string][]jetstream.Consumer, error) {
	if n, err := w.cfg.Runtime.ReapOrphans(ctx, w.cfg.ID); !unsupported(err) {
		if err != nil {
			w.log.WarnContext(ctx, "reap orphaned containers", slog.Any("error", err))
		} else if n > 0 {
			w.log.InfoContext(ctx, "reaped containers left by a previous run", slog.Int("count", n))
		}
	}
	if err := w.cfg.Runtime.Start(ctx); err != nil {
		return nil, fmt.Errorf("worker: start the sandbox runtime: %w", err)
	}
	consumers, err := w.setUpQueue(ctx)
	if err != nil {
		return nil, err
	}
	if err := w.ensureJobIO(ctx); err != nil {
		return nil, err
	}
	w.probes.once(ctx)
	return consumers, nil
}

// subscribe registers the slots' figures and subscribes to cancels, reaps
// and the sessions' subjects.
func (w *Worker) subscribe(ctx context.Context, undo *runUndo) error {
	reg, err := w.cfg.Metrics.RegisterSlots(func() (int64, int64) {
		b := w.busy.Load()
		return b, int64(w.cfg.Concurrency) - b
	})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	undo.push(func() { _ = reg.Unregister() })
	cancelSub, err := w.cfg.NATS.Subscribe(job.CancelSubject, w.cancels.onCancel)
	if err != nil {
		return fmt.Errorf("worker: subscribe %s: %w", job.CancelSubject, err)
	}
	undo.push(func() { _ = cancelSub.Unsubscribe() })
	reapSub, err := w.cfg.NATS.Subscribe(job.ReapSubject, w.owner.onReap(ctx))
	if err != nil {
		return fmt.Errorf("worker: subscribe %s: %w", job.ReapSubject, err)
	}
	undo.push(func() { _ = reapSub.Unsubscribe() })
	stopSessions, err := w.startSessions(ctx)
	if err != nil {
		return err
	}
	undo.push(stopSessions)
	return nil
}

// running is what the drain ends: the jobs, the loops, and the context the
// jobs run under (hard outlives Run's ctx: running jobs keep going while
// the worker drains).
type running struct {
	jobs     errgroup.Group
	loops    errgroup.Group
	stopHard context.CancelCauseFunc
}

// startLoops starts the probes, the sweeps, each runtime's registration
// and max-deliveries watch, and the pull of jobs.
func (w *Worker) startLoops(ctx context.Context, undo *runUndo, consumers map[string][]jetstream.Consumer) (*running, error) {
	run := &running{}
	// The backend probe runs until the drain is over: a job held for the
	// backend (backend.go) resumes if it comes back while the worker drains.
	var probes errgroup.Group
	undo.push(func() { _ = probes.Wait() })
	hard, stopHard := context.WithCancelCause(context.WithoutCancel(ctx))
	run.stopHard = stopHard
	undo.push(func() { stopHard(nil) })
	loopCtx, stopLoops := context.WithCancel(ctx)
	undo.push(func() { stopLoops(); _ = run.loops.Wait() })
	run.loops.Go(func() error { w.storeWatch.run(loopCtx); return nil })
	run.loops.Go(func() error { w.probes.run(loopCtx); return nil })
	// A backend without a health check says so to the first check; one
	// with it is probed until the drain is over.
	_ = w.backend.check(ctx)
	if !w.backend.noHealth.Load() {
		probes.Go(func() error { w.backend.probe(hard); return nil })
		up, err := w.cfg.Metrics.RegisterSandboxUp(func() bool { err, _ := w.backend.state(); return err == nil })
		if err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
		undo.push(func() { _ = up.Unregister() })
	}
	run.loops.Go(func() error { w.owner.sweep(loopCtx); return nil })
	run.loops.Go(func() error { w.retireLegacyConsumers(loopCtx); return nil })
	src, err := w.startPull(loopCtx, hard, undo, consumers, run)
	if err != nil {
		return nil, err
	}
	undo.push(src.close)
	return run, nil
}

// startPull watches each runtime's max deliveries, registers its
// runtimes, and pulls jobs in fair turns across the tenants' backlogs
// (fairshare.go) from the consumers setUpQueue made.
func (w *Worker) startPull(loopCtx, hard context.Context, undo *runUndo, consumers map[string][]jetstream.Consumer, run *running) (*jobSource, error) {
	var runtimes []string
	for rt := range consumers {
		runtimes = append(runtimes, rt)
		adv, err := w.advisories.watch(hard, rt)
		if err != nil {
			return nil, err
		}
		undo.push(func() { _ = adv.Unsubscribe() })
		run.loops.Go(func() error { w.registry.run(loopCtx, rt); return nil })
	}
	slices.Sort(runtimes)
	src, err := newJobSource(w.js, w.cfg.NATS, w.cfg.Queue, w.cfg.Clock, runtimes)
	if err != nil {
		return nil, err
	}
	run.loops.Go(func() error { w.pull(loopCtx, hard, src, &run.jobs); return nil })
	return src, nil
}

// drain waits for the loops to end, then for the running jobs within
// DrainTimeout; past it, the jobs still running are handed back.
func (w *Worker) drain(run *running) {
	_ = run.loops.Wait()
	w.log.Info("draining", slog.Int64("running", w.busy.Load()), slog.Duration("grace", w.cfg.DrainTimeout))
	done := make(chan struct{})
	go func() { _ = run.jobs.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(w.cfg.DrainTimeout):
		w.log.Warn("drain grace period over; handing running jobs back", slog.Int64("running", w.busy.Load()))
		run.stopHard(errForcedDrain)
		<-done
	}
	w.log.Info("worker stopped")
}

// pull fetches one message per free slot until ctx ends.
func (w *Worker) pull(ctx, hard context.Context, src *jobSource, jobs *errgroup.Group) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.slots:
		}
		msg, err := w.next(ctx, src)
		if msg == nil {
			w.slots <- struct{}{}
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				w.log.WarnContext(ctx, "fetch job", slog.Any("error", err))
				sleep(ctx, time.Second)
			}
			continue
		}
		w.busy.Add(1)
		jobs.Go(func() error {
			defer func() {
				w.busy.Add(-1)
				// The job's tenant may have more jobs, held back by its
				// running-jobs bound until now: the freed slot looks there.
				if subj, ok := queue.BacklogSubjectOf(msg.Subject()); ok {
					src.settled(subj)
				}
				w.slots <- struct{}{}
			}()
			w.handle(hard, msg)
			return nil
		})
	}
}

// next waits up to a few seconds for one message, taken in fair turns across
// tenants (fairshare.go); (nil, nil) means none came.
func (w *Worker) next(ctx context.Context, src *jobSource) (jetstream.Msg, error) {
	for !w.storeWatch.up() {
		// The store is down: taking a job now would only hold it hostage.
		if !sleep(ctx, 200*time.Millisecond) {
			return nil, nil
		}
	}
	// So is the sandbox backend: a job taken now would spend a delivery.
	// A wait for a job that began before it went away ends when it does.
	if !w.backend.wait(ctx) {
		return nil, nil
	}
	upCtx, stop := w.backend.whileUp(ctx)
	defer stop()
	return src.next(upCtx, 5*time.Second)
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
