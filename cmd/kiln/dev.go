package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	ktrace "github.com/kilnrun/kiln/trace"
)

func init() {
	register("dev", "all in one process: API + worker + embedded NATS JetStream (for a laptop)", cmdDev)
}

// devConfig is what `kiln dev` runs: the API, the worker and the embedded
// NATS server's store, each setting from the one flag (or variable) that
// names it.
type devConfig struct {
	API    apiConfig
	Worker workerConfig
	Store  string // JetStream store directory
}

// devFlags registers kiln dev's flags on fs; finish turns what was parsed
// into the configuration. Every flag -h lists must change the result
// (TestDevFlagsAreWired).
func devFlags(fs *flag.FlagSet) (finish func() devConfig) {
	var c devConfig
	apiFlags(fs, &c.API)
	workerFlags(fs, &c.Worker, false)
	// The API's address already serves /metrics; the worker's endpoints
	// (its /healthz and /readyz, and /metrics again) only when asked for.
	if f := fs.Lookup("metrics-addr"); f != nil {
		f.DefValue = ""
		_ = f.Value.Set("")
	}
	stringVar(fs, &c.API.DevEgress, "egress-allow", "KILN_DEV_EGRESS_ALLOW", "", "hosts the jobs may ask to reach with \"network\": {\"allow\": [...]}, comma-separated (api.example.org,*.data.gov:443); default none. Only without API keys: with keys, set egress= on their lines of the key file")
	stringVar(fs, &c.Store, "nats-store", "KILN_NATS_STORE", filepath.Join(os.TempDir(), "kiln-jetstream"), "JetStream store directory of the embedded NATS server")
	return func() devConfig {
		c.API.APIKeys = os.Getenv("KILN_API_KEYS")
		// One flag each for what the API and the worker share.
		c.Worker.RedisURL, c.Worker.QueueMaxMsgs, c.Worker.QueueMaxByte, c.Worker.Replicas = c.API.RedisURL, c.API.QueueMaxMsgs, c.API.QueueMaxBytes, c.API.QueueReplicas
		c.Worker.Sentinel, c.Worker.LogLevel = c.API.Sentinel, c.API.LogLevel
		return c
	}
}

func cmdDev(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("kiln dev", flag.ContinueOnError)
	finish := devFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "kiln dev:", err)
		return 2
	}
	dc := finish()
	api, wk, store := dc.API, dc.Worker, dc.Store
	log, err := newLogger("dev", api.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	api.Logger = log

	// Embedded JetStream on a loopback port nobody else needs to know.
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: store, NoSigs: true, NoLog: true, ServerName: "kiln-dev"})
	if err != nil {
		log.ErrorContext(ctx, "embedded NATS", slog.Any("error", err))
		return 1
	}
	go ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		log.ErrorContext(ctx, "embedded NATS did not start within 10s")
		return 1
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.Name("kiln-dev"))
	if err != nil {
		log.ErrorContext(ctx, "connect to embedded NATS", slog.Any("error", err))
		return 1
	}
	defer nc.Close()
	log.InfoContext(ctx, "embedded NATS JetStream", slog.String("url", ns.ClientURL()), slog.String("store", store))

	tel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-dev"})
	if err != nil {
		log.ErrorContext(ctx, "telemetry setup", slog.Any("error", err))
		return 1
	}
	defer shutdownTelemetry(ctx, log, tel)
	api.TracerProvider, api.Propagator, api.MetricsHandler = tel.TracerProvider(), tel.Propagator(), tel.MetricsHandler()
	if api.Metrics, err = ktrace.NewMetrics(tel.MeterProvider()); err != nil {
		log.ErrorContext(ctx, "metrics setup", slog.Any("error", err))
		return 1
	}
	if api.TenantMetrics, err = ktrace.NewTenantMetrics(tel.MeterProvider()); err != nil {
		log.ErrorContext(ctx, "metrics setup", slog.Any("error", err))
		return 1
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel() // one part failing stops the other
			}
		}()
	}
	run("api", func() error { return runAPI(ctx, api, nc) })
	run("worker", func() error { return runWorker(ctx, wk, nc, log, tel) })
	wg.Wait()
	close(errs)
	code := 0
	for err := range errs {
		log.Error("kiln dev stopped", slog.Any("error", err))
		code = 1
	}
	return code
}
