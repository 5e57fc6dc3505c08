package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/callback"
	"github.com/kilnrun/kiln/internal/queue"
	"github.com/kilnrun/kiln/producer"
)

// callbackConfig is the API's callback settings: which addresses callbacks
// may reach and how the API's deliverer retries them.
type callbackConfig struct {
	AllowNetworks string // comma-separated CIDRs allowed besides public addresses
	Timeout       time.Duration
	RetryInitial  time.Duration
	RetryMax      time.Duration
	MaxAge        time.Duration
	Concurrency   int
	// DestinationConcurrency bounds the callbacks in flight to one receiver.
	DestinationConcurrency int
	Disabled               bool // no deliverer in this process (another API process delivers)
}

func callbackFlags(fs *flag.FlagSet, cfg *callbackConfig) {
	stringVar(fs, &cfg.AllowNetworks, "callback-allow-networks", "KILN_CALLBACK_ALLOW_NETWORKS", "", "networks (CIDR, comma-separated) callbacks may reach besides public addresses, e.g. 10.1.0.0/16; loopback, private and link-local addresses are refused otherwise")
	durationVar(fs, &cfg.Timeout, "callback-timeout", "KILN_CALLBACK_TIMEOUT", callback.TimeoutDefault, "one callback attempt at most (connect, send, answer)")
	durationVar(fs, &cfg.RetryInitial, "callback-retry-initial", "KILN_CALLBACK_RETRY_INITIAL", callback.RetryInitialDefault, "back-off after a callback's first failed attempt; doubles each attempt")
	durationVar(fs, &cfg.RetryMax, "callback-retry-max", "KILN_CALLBACK_RETRY_MAX", callback.RetryMaxDefault, "longest back-off between callback attempts")
	durationVar(fs, &cfg.MaxAge, "callback-max-age", "KILN_CALLBACK_MAX_AGE", callback.MaxAgeDefault, "how long after a job ended its callback is still retried")
	intVar(fs, &cfg.Concurrency, "callback-concurrency", "KILN_CALLBACK_CONCURRENCY", callback.ConcurrencyDefault, "callbacks sent at once by this process")
	intVar(fs, &cfg.DestinationConcurrency, "callback-destination-concurrency", "KILN_CALLBACK_DESTINATION_CONCURRENCY", callback.DestinationConcurrencyDefault, "callbacks sent at once by this process to one receiver (scheme, host and port), whatever their tenants: a receiver that hangs holds no more")
	boolVar(fs, &cfg.Disabled, "callback-deliverer-off", "KILN_CALLBACK_DELIVERER_OFF", false, "run no callback deliverer in this process (callbacks are still accepted; another API process delivers them)")
}

// callbackPolicy is the submit-time check of callback URLs.
func callbackPolicy(cfg callbackConfig, secrets map[string][]byte) (callback.Policy, error) {
	nets, err := callback.ParseNetworks(strings.Split(cfg.AllowNetworks, ","))
	if err != nil {
		return callback.Policy{}, fmt.Errorf("--callback-allow-networks: %w", err)
	}
	return callback.Policy{Guard: callback.NewGuard(nets), Secrets: func(t string) ([]byte, bool) {
		s, ok := secrets[t]
		return s, ok
	}}, nil
}

// startDeliverer runs the callback deliverer until ctx ends; wait returns
// once it has stopped.
func startDeliverer(ctx context.Context, cfg callbackConfig, policy callback.Policy, tenants map[string]producer.Tenant,
	nc *nats.Conn, store *cache.Store, q queue.Config, log *slog.Logger) (wait func(), err error) {
	if cfg.Disabled {
		return func() {}, nil
	}
	d, err := callback.New(callback.Config{
		NATS: nc, Store: store, Queue: q, Guard: policy.Guard, Secrets: policy.Secrets,
		Timeout: cfg.Timeout, RetryInitial: cfg.RetryInitial, RetryMax: cfg.RetryMax, MaxAge: cfg.MaxAge,
		Concurrency: cfg.Concurrency, DestinationConcurrency: cfg.DestinationConcurrency, Logger: log,
		TenantConcurrency: func(t string) int { return int(tenants[t].Bounds.CallbackConcurrency) },
	})
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.Run(ctx); err != nil {
			log.ErrorContext(ctx, "callback deliverer stopped", slog.Any("error", err))
		}
	}()
	return func() { <-done }, nil
}
