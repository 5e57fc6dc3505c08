package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/e2bapi"
	"github.com/kilnrun/kiln/internal/audit"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	ktrace "github.com/kilnrun/kiln/trace"
)

func init() { register("api", "run the HTTP API", cmdAPI) }

// apiConfig is everything runAPI needs besides the NATS connection.
type apiConfig struct {
	Addr        string
	RedisURL    string
	NATSURL     string // used by cmdAPI to connect; runAPI takes the connection
	APIKeysFile string
	// AuditRetention is how long tenants' audit records are kept.
	AuditRetention time.Duration
	APIKeys        string // comma list, from KILN_API_KEYS only (never a flag: ps shows flags)
	JobTTL         time.Duration
	ResultTTL      time.Duration
	MaxWait        time.Duration
	MaxBatch       int
	MaxBodyBytes   int64
	// MaxBodyBytesInFlight bounds the bytes of request bodies held at once.
	MaxBodyBytesInFlight int64
	// CacheMaxAge is the oldest cached result "cache": true accepts.
	CacheMaxAge     time.Duration
	QueueMaxMsgs    int64
	QueueMaxBytes   int64
	QueueReplicas   int
	ShutdownTimeout time.Duration
	LogLevel        string
	// DevEgress is the egress allowance of the tenant of a server without
	// API keys (kiln dev --egress-allow); default none.
	DevEgress string
	// TraceURL links a run page's trace: a URL holding {trace_id}.
	TraceURL string
	Callback callbackConfig
	Sentinel sentinelConfig

	// Set by the caller, not by flags. Zero values: discard logs, the
	// global tracer provider, W3C trace context, no metrics.
	Logger         *slog.Logger
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
	Metrics        *ktrace.Metrics
	TenantMetrics  *ktrace.TenantMetrics
	MetricsHandler http.Handler // served at /metrics when set
	// Ready, when set, receives the listening address once the API serves.
	Ready func(addr string)
}

// defaultAPIConfig is the api command's configuration with every flag at
// its default and no environment applied, for callers such as `kiln dev`
// that start the API without parsing its flags.
func defaultAPIConfig() apiConfig {
	var cfg apiConfig
	apiFlags(flag.NewFlagSet("api-defaults", flag.ContinueOnError), &cfg)
	return cfg
}

// apiFlags registers the api command's settings on fs.
func apiFlags(fs *flag.FlagSet, cfg *apiConfig) {
	stringVar(fs, &cfg.Addr, "addr", "KILN_ADDR", "127.0.0.1:8080", "HTTP listen address")
	stringVar(fs, &cfg.RedisURL, "redis-url", "KILN_REDIS_URL", cache.URLDefault, "Redis URL (redis://[:password@]host:port/db, rediss:// for TLS)")
	sentinelFlags(fs, &cfg.Sentinel)
	stringVar(fs, &cfg.APIKeysFile, "api-keys-file", "KILN_API_KEYS_FILE", "", "file of API keys, one NAME:KEY (or KEY) per line; # comments. With no keys here or in $KILN_API_KEYS, authentication is off (dev mode)")
	durationVar(fs, &cfg.JobTTL, "job-ttl", "KILN_JOB_TTL", cache.JobTTLDefault, "how long job records and Idempotency-Keys are kept")
	durationVar(fs, &cfg.ResultTTL, "result-ttl", "KILN_RESULT_TTL", cache.ResultTTLDefault, "how long a cached result answers identical jobs")
	durationVar(fs, &cfg.AuditRetention, "audit-retention", "KILN_AUDIT_RETENTION", audit.RetentionDefault, "how long tenants' audit records (GET /v1/audit) are kept")
	durationVar(fs, &cfg.MaxWait, "max-wait", "KILN_MAX_WAIT", producer.MaxWaitDefault, "longest ?wait= long-poll")
	intVar(fs, &cfg.MaxBatch, "max-batch", "KILN_MAX_BATCH", producer.MaxBatchDefault, "most jobs per batch and ids per list request")
	int64Var(fs, &cfg.MaxBodyBytes, "max-body-bytes", "KILN_MAX_BODY_BYTES", 32<<20, "largest request body")
	int64Var(fs, &cfg.MaxBodyBytesInFlight, "max-body-bytes-in-flight", "KILN_MAX_BODY_BYTES_IN_FLIGHT", 64<<20, "bytes of request bodies held at once; more wait up to 2s, then get 503 (at least max-body-bytes)")
	durationVar(fs, &cfg.CacheMaxAge, "cache-max-age", "KILN_CACHE_MAX_AGE", producer.CacheMaxAgeDefault, "oldest cached result a job with \"cache\": true is answered with; clients may ask for another with {\"max_age_s\": N}")
	int64Var(fs, &cfg.QueueMaxMsgs, "queue-max-msgs", "KILN_QUEUE_MAX_MSGS", queue.DefaultMaxMsgs, "queued jobs at most before submissions get 429")
	int64Var(fs, &cfg.QueueMaxBytes, "queue-max-bytes", "KILN_QUEUE_MAX_BYTES", queue.DefaultMaxBytes, "queued bytes at most before submissions get 429")
	intVar(fs, &cfg.QueueReplicas, "queue-replicas", "KILN_QUEUE_REPLICAS", 1, "JetStream replicas of the job stream")
	durationVar(fs, &cfg.ShutdownTimeout, "shutdown-timeout", "KILN_SHUTDOWN_TIMEOUT", 10*time.Second, "how long in-flight requests may finish at shutdown")
	stringVar(fs, &cfg.LogLevel, "log-level", "KILN_LOG_LEVEL", "info", "debug, info, warn or error")
	stringVar(fs, &cfg.TraceURL, "trace-url", "KILN_TRACE_URL", "", "where the run page (/ui/jobs/{id}) links a run's trace: a URL holding {trace_id}, e.g. http://127.0.0.1:16686/trace/{trace_id} for Jaeger; default: the trace id, unlinked")
	callbackFlags(fs, &cfg.Callback)
}

func cmdAPI(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln api", flag.ContinueOnError)
	var cfg apiConfig
	apiFlags(fs, &cfg)
	// Not among apiFlags: kiln dev embeds its NATS server.
	stringVar(fs, &cfg.NATSURL, "nats-url", "KILN_NATS_URL", nats.DefaultURL, "NATS server URL(s), comma-separated")
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "kiln api:", err)
		return 2
	}
	cfg.APIKeys = os.Getenv("KILN_API_KEYS")
	var err error
	cfg.Logger, err = newLogger("api", cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	log := cfg.Logger
	cache.RouteClientLogs(log)

	tel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-api"})
	if err != nil {
		log.ErrorContext(ctx, "telemetry setup", slog.Any("error", err))
		return 1
	}
	defer shutdownTelemetry(ctx, log, tel)
	cfg.TracerProvider, cfg.Propagator, cfg.MetricsHandler = tel.TracerProvider(), tel.Propagator(), tel.MetricsHandler()
	if cfg.Metrics, err = ktrace.NewMetrics(tel.MeterProvider()); err != nil {
		log.ErrorContext(ctx, "metrics setup", slog.Any("error", err))
		return 1
	}
	if cfg.TenantMetrics, err = ktrace.NewTenantMetrics(tel.MeterProvider()); err != nil {
		log.ErrorContext(ctx, "metrics setup", slog.Any("error", err))
		return 1
	}

	nc, err := nats.Connect(cfg.NATSURL, nats.Name("kiln-api"), nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond),
		nats.RetryOnFailedConnect(true), // start while NATS is down; /readyz says so
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: our own Close at shutdown
				log.Warn("nats disconnected", slog.Any("error", err))
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", slog.String("url", c.ConnectedUrlRedacted())) }))
	if err != nil {
		log.ErrorContext(ctx, "connect to NATS", slog.String("url", cfg.NATSURL), slog.Any("error", err))
		return 1
	}
	defer nc.Close()
	if err := runAPI(ctx, cfg, nc); err != nil {
		log.ErrorContext(ctx, "api stopped", slog.Any("error", err))
		return 1
	}
	return 0
}

// runAPI serves the API on cfg.Addr until ctx ends, then shuts down
// gracefully: open long-polls answer at once, other requests get
// cfg.ShutdownTimeout to finish. nc stays open (the caller owns it), which
// lets `kiln dev` pass a connection to its embedded NATS server.
func runAPI(ctx context.Context, cfg apiConfig, nc *nats.Conn) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	keys, tenants, secrets, err := loadKeyFile(cfg.APIKeysFile, cfg.APIKeys)
	if err != nil {
		return err
	}
	if err := devEgress(cfg.DevEgress, keys, tenants); err != nil {
		return fmt.Errorf("api: %w", err)
	}
	callbacks, err := callbackPolicy(cfg.Callback, secrets)
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	store, err := cache.Open(ctx, cfg.Sentinel.apply(cache.Config{URL: cfg.RedisURL, JobTTL: cfg.JobTTL, ResultTTL: cfg.ResultTTL, Logger: log})) // Redis may come up later
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	defer store.Close()
	srv, err := producer.New(ctx, producer.Config{
		Store: store, NATS: nc,
		Queue:   queue.Config{MaxMsgs: cfg.QueueMaxMsgs, MaxBytes: cfg.QueueMaxBytes, Replicas: cfg.QueueReplicas},
		APIKeys: keys, Tenants: tenants,
		CacheMaxAge: cfg.CacheMaxAge, MaxBodyBytesInFlight: cfg.MaxBodyBytesInFlight, TenantMetrics: cfg.TenantMetrics,
		MaxBodyBytes: cfg.MaxBodyBytes, MaxBatch: cfg.MaxBatch, MaxWait: cfg.MaxWait,
		Logger: log, TracerProvider: cfg.TracerProvider, Propagator: cfg.Propagator, Metrics: cfg.Metrics,
		Callbacks: callbacks, Audit: audit.Config{Retention: cfg.AuditRetention}, TraceURL: cfg.TraceURL,
	})
	if err != nil {
		return fmt.Errorf("api: %w", err)
	}
	defer srv.Close()
	// E2B's SDKs, pointed here by E2B_API_URL and E2B_SANDBOX_URL (docs/e2b.md).
	d := producer.DomainOf(srv)
	d.Mount(e2bapi.New(d, log))
	go srv.Reconcile(ctx)
	dctx, stopDeliverer := context.WithCancel(ctx)
	waitDeliverer, err := startDeliverer(dctx, cfg.Callback, callbacks, tenants, nc, store,
		queue.Config{MaxMsgs: cfg.QueueMaxMsgs, MaxBytes: cfg.QueueMaxBytes, Replicas: cfg.QueueReplicas}, log)
	if err != nil {
		stopDeliverer()
		return fmt.Errorf("api: %w", err)
	}
	defer func() { stopDeliverer(); waitDeliverer() }()
	handler := srv.Handler()
	if cfg.MetricsHandler != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", cfg.MetricsHandler)
		mux.Handle("/", handler)
		handler = mux
	}
	maxWait := cmp.Or(cfg.MaxWait, producer.MaxWaitDefault)
	hs := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute, // bodies up to 32 MiB from slow clients
		WriteTimeout:      maxWait + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	hs.RegisterOnShutdown(srv.StopLongPolls)
	addr := cmp.Or(cfg.Addr, "127.0.0.1:8080") // never every interface by accident
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("api: listen on %s: %w", addr, err)
	}
	log.InfoContext(ctx, "api listening", slog.String("addr", ln.Addr().String()), slog.Bool("auth", len(keys) > 0))
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("api: serve: %w", err)
	case <-ctx.Done():
	}
	log.InfoContext(ctx, "api shutting down")
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cmp.Or(cfg.ShutdownTimeout, 10*time.Second))
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return fmt.Errorf("api: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("api: serve: %w", err)
	}
	return nil
}

// devEgress gives the one tenant of a server without API keys (dev mode)
// the egress allowance rules (kiln dev --egress-allow), when set.
func devEgress(rules string, keys map[string]string, tenants map[string]producer.Tenant) error {
	if rules == "" {
		return nil
	}
	if len(keys) > 0 {
		return errors.New("--egress-allow gives the tenant of a server without API keys an egress allowance; with API keys, set egress= on their lines of the key file")
	}
	allow, err := parseEgressAllowance(rules)
	if err != nil {
		return fmt.Errorf("--egress-allow: %w", err)
	}
	t := tenants[job.DefaultTenant]
	t.Egress = allow
	tenants[job.DefaultTenant] = t
	return nil
}

// loadAPIKeys reads NAME:KEY (or bare KEY) entries from file, one per line,
// and from list, comma-separated. Bare keys are named key1, key2, ... The
// name is the tenant. In the file, settings of the tenant may follow the key
// (see parseTenantOptions); they must agree on every line of one name.
func loadAPIKeys(file, list string) (map[string]string, map[string]producer.Tenant, error) {
	keys, tenants, _, err := loadKeyFile(file, list)
	return keys, tenants, err
}

// loadTenants is loadAPIKeys returning each tenant's callback signing
// secret instead of its settings.
func loadTenants(file, list string) (map[string]string, map[string][]byte, error) {
	keys, _, secrets, err := loadKeyFile(file, list)
	return keys, secrets, err
}

// loadKeyFile reads entries NAME:KEY[:CALLBACK_SECRET] [setting=value ...].
// A tenant listed with several keys may give its callback secret on any of
// its lines, and must not give two different ones.
func loadKeyFile(file, list string) (map[string]string, map[string]producer.Tenant, map[string][]byte, error) {
	keys := map[string]string{}
	tenants := map[string]producer.Tenant{}
	secrets := map[string][]byte{}
	withOpts := map[string]bool{}
	add := func(where, entry string) error {
		entry = strings.TrimSpace(entry)
		if entry == "" || strings.HasPrefix(entry, "#") {
			return nil
		}
		fields := strings.Fields(entry)
		entry = fields[0]
		name, key, ok := strings.Cut(entry, ":")
		if !ok {
			name, key = fmt.Sprintf("key%d", len(keys)+1), entry
		}
		key, secret, _ := strings.Cut(key, ":")
		name, key, secret = strings.TrimSpace(name), strings.TrimSpace(key), strings.TrimSpace(secret)
		if key == "" || name == "" {
			return fmt.Errorf("api keys: %s: entry %q has an empty name or key (use NAME:KEY or NAME:KEY:CALLBACK_SECRET)", where, entry)
		}
		if _, dup := keys[key]; dup {
			return fmt.Errorf("api keys: %s: a key is listed twice (names %q and %q)", where, keys[key], name)
		}
		if secret != "" {
			if prev, ok := secrets[name]; ok && string(prev) != secret {
				return fmt.Errorf("api keys: %s: tenant %q is given two different callback secrets", where, name)
			}
			secrets[name] = []byte(secret)
		}
		keys[key] = name
		if len(fields) > 1 {
			t, err := parseTenantOptions(fields[1:])
			if err != nil {
				return fmt.Errorf("api keys: %s: tenant %q: %w", where, name, err)
			}
			if prev, seen := tenants[name]; seen && prev.Redact != nil && t.Redact != nil && reflect.DeepEqual(*prev.Redact, *t.Redact) {
				t.Redact = prev.Redact // one policy, so the lines compare equal
			}
			if prev, seen := tenants[name]; seen && !reflect.DeepEqual(prev, t) {
				return fmt.Errorf("api keys: %s: tenant %q has other settings on an earlier line; give every key of a tenant the same settings", where, name)
			}
			tenants[name], withOpts[name] = t, true
		} else if withOpts[name] {
			return fmt.Errorf("api keys: %s: tenant %q has settings on an earlier line; repeat them on this key's line", where, name)
		} else {
			tenants[name] = producer.Tenant{}
		}
		return nil
	}
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("api keys: %w", err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for n := 1; sc.Scan(); n++ {
			if err := add(fmt.Sprintf("%s line %d", file, n), sc.Text()); err != nil {
				return nil, nil, nil, err
			}
		}
		if err := sc.Err(); err != nil {
			return nil, nil, nil, fmt.Errorf("api keys: read %s: %w", file, err)
		}
	}
	for _, e := range strings.Split(list, ",") {
		if err := add("$KILN_API_KEYS", e); err != nil {
			return nil, nil, nil, err
		}
	}
	return keys, tenants, secrets, nil
}
