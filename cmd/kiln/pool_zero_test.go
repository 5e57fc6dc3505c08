package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/testenv"
	"github.com/kilnrun/kiln/internal/testkit"
	ktrace "github.com/kilnrun/kiln/trace"
)

// `kiln worker --pool-max 0` starts against the real containerd (it used to
// stop at start-up: the default --pool-min 1 exceeded the maximum) and
// gets ready (its queue set up, its stores and containerd answering).
func TestWorkerStartsWithPoolMaxZero(t *testing.T) {
	containerd := testenv.Containerd(t)
	redis, ns := testenv.StartRedis(t), testenv.StartNATS(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))

	fs := flag.NewFlagSet("kiln worker", flag.ContinueOnError)
	var wk workerConfig
	workerFlags(fs, &wk, true)
	args := []string{"--pool-max", "0", "--id", "cmd-pool-zero", "--concurrency", "1",
		"--containerd", containerd, "--containerd-namespace", testenv.ContainerdNamespace(),
		"--redis-url", redis.URL(), "--nats-url", ns.URL(), "--metrics-addr", metricsAddr}
	if err := parseFlagsEnv(fs, args, func(string) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	tel, err := ktrace.Setup(ctx, ktrace.Config{ServiceName: "kiln-worker"})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdownTelemetry(ctx, log, tel)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	done := make(chan error, 1)
	go func() { done <- runWorker(ctx, wk, nc, log, tel) }()

	testkit.Eventually(t, 30*time.Second, "the worker to be ready", func() bool {
		select {
		case err := <-done:
			t.Fatalf("kiln worker --pool-max 0 stopped at start-up: %v", err)
		default:
		}
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("worker stopped with %v", err)
	}
}
