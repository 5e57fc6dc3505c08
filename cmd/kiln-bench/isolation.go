package main

import (
	"cmp"
	"context"
	"fmt"
	"os"

	"github.com/kilnrun/kiln/sandbox"
)

// isolationBenchRuntimes are two names for the python image in one runtime:
// the same cold print(1) under runc and under gVisor (runsc), in the same run.
var isolationBenchRuntimes = []struct {
	runtime   string
	isolation sandbox.Isolation
}{
	{"python", sandbox.IsolationRunc},
	{"python-gvisor", sandbox.IsolationGVisor},
}

func init() {
	register(section{
		Name:   "isolation",
		Order:  16,
		Setup:  isolationRows,
		Ratios: []ratio{{isolationRowName(sandbox.IsolationGVisor), isolationRowName(sandbox.IsolationRunc)}},
	})
}

func isolationRowName(iso sandbox.Isolation) string {
	return fmt.Sprintf("sandbox.Run python under %s: print(1)", iso)
}

// isolationRows measures a cold python sandbox per job under each isolation.
// gVisor needs runsc and its wrapper (deploy/local/runsc.sh, part of `make deps`).
func isolationRows(ctx context.Context, _ *options) ([]row, func(), error) {
	addr := cmp.Or(os.Getenv("KILN_CONTAINERD_ADDRESS"), sandbox.AddressDefault)
	images, isolation := map[string]string{}, map[string]string{}
	for _, r := range isolationBenchRuntimes {
		images[r.runtime] = "kiln.local/python:latest"
		isolation[r.runtime] = string(r.isolation)
	}
	workerID := fmt.Sprintf("kiln-bench-iso-%d", os.Getpid())
	rt, err := sandbox.New(ctx, sandbox.Config{
		Address: addr, Namespace: os.Getenv("KILN_CONTAINERD_NAMESPACE"), WorkerID: workerID,
		Images: images, Isolation: isolation,
	})
	if err != nil {
		return nil, nil, err
	}
	var rows []row
	for _, r := range isolationBenchRuntimes {
		if _, err := rt.Image(ctx, r.runtime); err != nil {
			rt.Close()
			return nil, nil, fmt.Errorf("runtime %s: %w (build it with `make image`)", r.runtime, err)
		}
		rows = append(rows, coldRunRow(rt, isolationRowName(r.isolation), string(r.isolation), r.runtime, "print(1)"))
	}
	return rows, func() { reap(rt, workerID); rt.Close() }, nil
}
