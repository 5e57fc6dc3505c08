package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/kilnrun/kiln/worker/egress"
	"log/slog"
	"net"
	"net/http"
	"os"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/redact"
	"github.com/kilnrun/kiln/sandbox"
	ktrace "github.com/kilnrun/kiln/trace"
	"github.com/kilnrun/kiln/worker"
)

func init() {
	register("worker", "run a worker: pull jobs and run them in containerd sandboxes", cmdWorker)
}

// workerConfig is the worker command's settings.
type workerConfig struct {
	ID               string
	Concurrency      int
	Containerd       string
	Namespace        string
	RedisURL         string
	Sentinel         sentinelConfig
	RedisRepl        replicaConfig
	NATSURL          string
	DrainTimeout     time.Duration
	MetricsAddr      string
	AckWait          time.Duration
	MaxDeliver       int
	QueueOwner       bool
	QueueShards      int
	QueueMaxMsgs     int64
	QueueMaxByte     int64
	Replicas         int
	LogLevel         string
	Runtimes         string
	Isolation        string
	Artifacts        job.ArtifactCaps
	Pool             sandbox.PoolConfig
	PoolMemoryMB     int64
	Boxes            sandbox.BoxConfig
	SessionsMax      int
	SessionsMemoryMB int64
	// SessionsTenantMemoryMB is one tenant's share of it.
	SessionsTenantMemoryMB int64
	// EgressTestHosts is the test-only name table of every job's egress
	// proxy (egress.ParseTestHosts).
	EgressTestHosts string
}

func workerFlags(fs *flag.FlagSet, cfg *workerConfig, withShared bool) {
	host, _ := os.Hostname()
	stringVar(fs, &cfg.ID, "id", "KILN_WORKER_ID", host, "worker id in results, logs and container labels; keep it stable so a restart reaps what a crash left")
	intVar(fs, &cfg.Concurrency, "concurrency", "KILN_CONCURRENCY", 0, "jobs run at once (0: one per CPU core)")
	stringVar(fs, &cfg.Containerd, "containerd", "KILN_CONTAINERD_ADDRESS", sandbox.AddressDefault, "containerd socket")
	stringVar(fs, &cfg.Namespace, "containerd-namespace", "KILN_CONTAINERD_NAMESPACE", sandbox.NamespaceDefault, "containerd namespace holding the sandbox images")
	durationVar(fs, &cfg.DrainTimeout, "drain-timeout", "KILN_DRAIN_TIMEOUT", worker.DrainTimeoutDefault, "on SIGTERM, how long running jobs may finish before they are handed back")
	stringVar(fs, &cfg.MetricsAddr, "metrics-addr", "KILN_METRICS_ADDR", "127.0.0.1:9091", "address of the worker's /metrics, /healthz and /readyz endpoints (empty: none)")
	durationVar(fs, &cfg.AckWait, "ack-wait", "KILN_ACK_WAIT", queue.DefaultAckWait, "redeliver a job when its worker sent no heartbeat for this long; also how long a job's lease lasts without renewal")
	intVar(fs, &cfg.MaxDeliver, "max-deliver", "KILN_MAX_DELIVER", queue.DefaultMaxDeliver, "deliveries per job before it is recorded as internal_error")
	intVar(fs, &cfg.Artifacts.MaxFiles, "artifact-max-files", "KILN_ARTIFACT_MAX_FILES", job.DefaultArtifactCaps.MaxFiles,
		fmt.Sprintf("files kept from a job's output dir (at most %d); the rest are listed as skipped", job.MaxArtifactCaps.MaxFiles))
	int64Var(fs, &cfg.Artifacts.MaxFileBytes, "artifact-max-file-bytes", "KILN_ARTIFACT_MAX_FILE_BYTES", job.DefaultArtifactCaps.MaxFileBytes,
		fmt.Sprintf("largest output file kept, in bytes (at most %d)", job.MaxArtifactCaps.MaxFileBytes))
	int64Var(fs, &cfg.Artifacts.MaxTotalBytes, "artifact-max-bytes", "KILN_ARTIFACT_MAX_BYTES", job.DefaultArtifactCaps.MaxTotalBytes,
		fmt.Sprintf("bytes kept from one job's output dir in all (at most %d)", job.MaxArtifactCaps.MaxTotalBytes))
	stringVar(fs, &cfg.Runtimes, "runtimes", "KILN_RUNTIMES", strings.Join(sandbox.RuntimesDefault(), ","), "runtimes this worker serves, comma-separated: name (image kiln.local/name:latest, built by make image RUNTIME=name) or name=image-reference")
	replicaFlags(fs, &cfg.RedisRepl)
	stringVar(fs, &cfg.Isolation, "isolation", "KILN_ISOLATION", "", "per-runtime isolation overriding the image's runtime.json, comma-separated runtime=runc|gvisor (e.g. python=gvisor); gvisor needs deploy/local/runsc.sh")
	intVar(fs, &cfg.Pool.Max, "pool-max", "KILN_POOL_MAX", 2, "sandboxes kept ready ahead of demand, at most, per runtime and limits class (0: no warm pool, every job gets a sandbox created for it)")
	intVar(fs, &cfg.Pool.Min, "pool-min", "KILN_POOL_MIN", 1, "sandboxes kept ready for each runtime's default limits whatever the demand (at most --pool-max)")
	int64Var(fs, &cfg.PoolMemoryMB, "pool-memory-mb", "KILN_POOL_MEMORY_MB", sandbox.PoolMemoryBudgetDefault>>20, "memory all ready sandboxes together may hold, in MiB")
	boolVar(fs, &cfg.Boxes.Off, "boxes-off", "KILN_BOXES_OFF", false, "run every job in a container of its own instead of a fresh inner sandbox of a box (slower; see docs/sandbox.md)")
	intVar(fs, &cfg.Boxes.MaxJobs, "box-max-jobs", "KILN_BOX_MAX_JOBS", sandbox.BoxMaxJobsDefault, "jobs a box serves before it is replaced")
	durationVar(fs, &cfg.Boxes.MaxAge, "box-max-age", "KILN_BOX_MAX_AGE", sandbox.BoxMaxAgeDefault, "how long a box serves jobs before it is replaced")
	intVar(fs, &cfg.Boxes.Max, "box-max", "KILN_BOX_MAX", sandbox.BoxMaxDefault, "boxes this worker keeps, idle or busy, across tenants (an idle box of another tenant is replaced to make room)")
	intVar(fs, &cfg.Boxes.Neutral, "box-neutral", "KILN_BOX_NEUTRAL", sandbox.BoxNeutralDefault, "boxes per runtime kept ready that no tenant has used yet")
	intVar(fs, &cfg.SessionsMax, "sessions-max", "KILN_SESSIONS_MAX", worker.SessionsMaxDefault, "sessions this worker holds at once, at most")
	int64Var(fs, &cfg.SessionsMemoryMB, "sessions-memory-mb", "KILN_SESSIONS_MEMORY_MB", worker.SessionsMemoryDefault>>20,
		"memory this worker's sessions may use together, in MiB: the sum of their memory_mb caps; a session that would not fit goes to another worker")
	int64Var(fs, &cfg.SessionsTenantMemoryMB, "sessions-tenant-memory-mb", "KILN_SESSIONS_TENANT_MEMORY_MB", 0,
		"memory one tenant's sessions may use on this worker, in MiB (0: half of --sessions-memory-mb), so one tenant cannot take the memory others' sessions need")
	stringVar(fs, &cfg.EgressTestHosts, "egress-test-hosts", "KILN_EGRESS_TEST_HOSTS", "",
		"TESTS ONLY: jobs' egress proxies resolve no name through DNS, only these: NAME=ADDR:PORT (a server the test started, the only way a loopback address is reached) or NAME=ADDR (an answer checked like any DNS answer), comma-separated")
	boolVar(fs, &cfg.QueueOwner, "queue-owner", "KILN_QUEUE_OWNER", false, "apply this worker's --ack-wait, --max-deliver and ready-stream settings to the existing job consumers and ready stream (otherwise a difference is only logged)")
	intVar(fs, &cfg.QueueShards, "queue-shards", "KILN_QUEUE_SHARDS", 1, fmt.Sprintf("consumers of each runtime's ready jobs, shared by the fleet (1 to %d; in a NATS cluster each is a Raft group); the same on every worker, changed only with the queue empty", queue.MaxShards))
	if !withShared { // kiln dev shares these with the API's flags
		return
	}
	stringVar(fs, &cfg.RedisURL, "redis-url", "KILN_REDIS_URL", cache.URLDefault, "Redis URL")
	sentinelFlags(fs, &cfg.Sentinel)
	stringVar(fs, &cfg.NATSURL, "nats-url", "KILN_NATS_URL", nats.DefaultURL, "NATS server URL(s), comma-separated")
	int64Var(fs, &cfg.QueueMaxMsgs, "queue-max-msgs", "KILN_QUEUE_MAX_MSGS", queue.DefaultMaxMsgs, "queued jobs at most (must match the API's)")
	int64Var(fs, &cfg.QueueMaxByte, "queue-max-bytes", "KILN_QUEUE_MAX_BYTES", queue.DefaultMaxBytes, "queued bytes at most (must match the API's)")
	intVar(fs, &cfg.Replicas, "queue-replicas", "KILN_QUEUE_REPLICAS", 1, "JetStream replicas of the job stream (must match the API's)")
	stringVar(fs, &cfg.LogLevel, "log-level", "KILN_LOG_LEVEL", "info", "debug, info, warn or error")
}

func cmdWorker(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln worker", flag.ContinueOnError)
	var cfg workerConfig
	workerFlags(fs, &cfg, true)
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "kiln worker:", err)
		return 2
	}
	log, err := newLogger("worker", cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cache.RouteClientLogs(log)
	tel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-worker"})
	if err != nil {
		log.ErrorContext(ctx, "telemetry setup", slog.Any("error", err))
		return 1
	}
	defer shutdownTelemetry(ctx, log, tel)
	nc, err := nats.Connect(cfg.NATSURL, nats.Name("kiln-worker-"+cfg.ID), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
		nats.RetryOnFailedConnect(true)) // start while NATS is down; Readiness says so
	if err != nil {
		log.ErrorContext(ctx, "connect to NATS", slog.String("url", cfg.NATSURL), slog.Any("error", err))
		return 1
	}
	defer nc.Close()
	if err := runWorker(ctx, cfg, nc, log, tel); err != nil {
		log.ErrorContext(ctx, "worker stopped", slog.Any("error", err))
		return 1
	}
	return 0
}

func shutdownTelemetry(ctx context.Context, log *slog.Logger, tel *ktrace.Providers) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := tel.Shutdown(sctx); err != nil {
		log.WarnContext(sctx, "telemetry shutdown", slog.Any("error", err))
	}
}

// runWorker runs a worker until ctx ends and it has drained. nc stays open.
func runWorker(ctx context.Context, cfg workerConfig, nc *nats.Conn, log *slog.Logger, tel *ktrace.Providers) error {
	// Every log line of the worker's parts (sandbox, store, worker) is
	// redacted: a key a job printed must not reach it through an error or a
	// file name.
	log = slog.New(redact.NewHandler(log.Handler()))
	metrics, err := ktrace.NewMetrics(tel.MeterProvider())
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	store, err := cache.Open(ctx, cfg.RedisRepl.apply(cfg.Sentinel.apply(cache.Config{URL: cfg.RedisURL, Logger: log}))) // Redis may come up later
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer store.Close()
	images, err := sandbox.ImagesFor(strings.Split(cfg.Runtimes, ","))
	if err != nil {
		return fmt.Errorf("worker: --runtimes %q: %w", cfg.Runtimes, err)
	}
	isolation, err := sandbox.IsolationFor(strings.Split(cfg.Isolation, ","))
	if err != nil {
		return fmt.Errorf("worker: --isolation %q: %w", cfg.Isolation, err)
	}
	// The pool refills only while a slot is free: the worker is made after
	// the runtime, so the check reads it once it exists.
	var busyWorker atomic.Pointer[worker.Worker]
	slots := cmp.Or(cfg.Concurrency, goruntime.NumCPU())
	pool := cfg.poolConfig()
	pool.Busy = func() bool {
		wk := busyWorker.Load()
		return wk != nil && wk.Busy() >= slots
	}
	rt, err := sandbox.New(ctx, sandbox.Config{
		Address: cfg.Containerd, Namespace: cfg.Namespace, WorkerID: cfg.ID,
		Images: images, Isolation: isolation, Fleet: store.Runtimes, LeaseScope: store.Identity(),
		ArtifactCaps: cfg.Artifacts, Pool: pool, Boxes: cfg.Boxes,
		Logger: log, TracerProvider: tel.TracerProvider(),
	})
	if err != nil {
		return fmt.Errorf("worker: sandbox runtime: %w", err)
	}
	defer rt.Close()
	testHosts, err := egress.ParseTestHosts(cfg.EgressTestHosts)
	if err != nil {
		return fmt.Errorf("--egress-test-hosts: %w", err)
	}
	if testHosts != nil {
		log.Warn("egress test hosts are set: jobs' proxies resolve only the given names, and may reach the loopback servers named", slog.String("egress_test_hosts", cfg.EgressTestHosts))
	}
	w, err := worker.New(worker.Config{
		EgressTestHosts: testHosts,
		Sessions:        worker.SessionConfig{Max: cfg.SessionsMax, MemoryBytes: cfg.SessionsMemoryMB << 20, TenantMemoryBytes: cfg.SessionsTenantMemoryMB << 20},
		ID:              cfg.ID, Runtime: rt, Store: store, NATS: nc, Concurrency: cfg.Concurrency,
		Queue: queue.Config{
			AckWait: cfg.AckWait, MaxDeliver: cfg.MaxDeliver,
			MaxMsgs: cfg.QueueMaxMsgs, MaxBytes: cfg.QueueMaxByte, Replicas: cfg.Replicas, Shards: cfg.QueueShards,
		},
		QueueOwner:   cfg.QueueOwner,
		DrainTimeout: cfg.DrainTimeout, Logger: log, TracerProvider: tel.TracerProvider(),
		Propagator: tel.Propagator(), Metrics: metrics,
	})
	if err != nil {
		return err
	}
	busyWorker.Store(w)
	poolReg, err := metrics.RegisterPool(func() []ktrace.PoolFigures { return poolFigures(rt.PoolStats()) })
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer poolReg.Unregister()
	boxReg, err := metrics.RegisterBoxes(func() ktrace.BoxFigures {
		b := rt.BoxStats()
		return ktrace.BoxFigures{Idle: int64(b.Idle), Neutral: int64(b.Neutral), Live: int64(b.Live),
			Hits: b.Hits, Claims: b.Claims, Misses: b.Misses, Retired: b.Retired, Prepared: b.Prepared, Discarded: b.Discarded}
	})
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer boxReg.Unregister()
	if cfg.MetricsAddr != "" {
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("worker: metrics listener: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", tel.MetricsHandler())
		mux.Handle("/", w.HealthHandler()) // /healthz, /readyz
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		defer hs.Close()
		log.InfoContext(ctx, "worker metrics", slog.String("addr", ln.Addr().String()))
	}
	return w.Run(ctx)
}

// Containerd is the worker's sandbox backend.
var _ worker.Sandboxes = (*sandbox.Containerd)(nil)

// poolConfig is the warm pool the flags ask for. --pool-min is at most
// --pool-max, so --pool-max 0 alone turns the pool off (the default
// --pool-min of 1 would otherwise be refused as larger than the maximum).
func (cfg workerConfig) poolConfig() sandbox.PoolConfig {
	pool := cfg.Pool
	pool.Min = min(pool.Min, pool.Max)
	pool.MemoryBudget = cfg.PoolMemoryMB << 20
	return pool
}

// poolFigures turns the runtime's pool figures into the metrics' own.
func poolFigures(stats []sandbox.PoolStats) []ktrace.PoolFigures {
	out := make([]ktrace.PoolFigures, 0, len(stats))
	for _, s := range stats {
		out = append(out, ktrace.PoolFigures{
			Runtime: s.Runtime, Idle: int64(s.Idle), Target: int64(s.Target), MemoryBytes: s.MemoryBytes,
			Hits: s.Hits, Misses: s.Misses, Refills: s.Refills, RefillSeconds: s.RefillTime.Seconds(),
		})
	}
	return out
}
