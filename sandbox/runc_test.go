package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	ctrd "github.com/kilnrun/kiln/sandbox/containerd"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/typeurl/v2"

	"github.com/kilnrun/kiln/job"
)

// TestRuncPinned: the runc that containerd's shim runs for a live sandbox is
// the release pinned in deploy/local/runc.sh, not the host's.
func TestRuncPinned(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	script, err := os.ReadFile("../deploy/local/runc.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^readonly version=(\S+)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("deploy/local/runc.sh pins no version")
	}
	pinned := string(m[1])

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	id := job.NewID()
	spec := py("import time\ntime.sleep(60)")
	spec.Limits.TimeoutMS = 60_000
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = rt.Run(ctx, Request{ID: id, Spec: spec})
	}()
	key := waitForContainer(t, rt, id)
	nctx := namespacesCtx(t, rt)
	filter := fmt.Sprintf(`labels.%q==%q`, ctrd.LabelJobID, id)
	if key != id {
		filter = fmt.Sprintf(`id==%q`, key) // the box running the job
	}
	cs, err := rt.client.Containers(nctx, filter)
	if err != nil || len(cs) != 1 {
		t.Fatalf("containers of the job: %d, %v", len(cs), err)
	}
	info, err := cs[0].Info(nctx)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if info.Runtime.Name != "io.containerd.runc.v2" || info.Runtime.Options == nil {
		t.Fatalf("runtime %q with options %v; want io.containerd.runc.v2 with a BinaryName", info.Runtime.Name, info.Runtime.Options)
	}
	v, err := typeurl.UnmarshalAny(info.Runtime.Options)
	if err != nil {
		t.Fatal(err)
	}
	opts, ok := v.(*runcoptions.Options)
	if !ok || opts.BinaryName != rt.cfg.Runc {
		t.Fatalf("runtime options %#v; want BinaryName %s", v, rt.cfg.Runc)
	}
	out, err := exec.CommandContext(t.Context(), opts.BinaryName, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", opts.BinaryName, err, out)
	}
	if first, _, _ := strings.Cut(string(out), "\n"); first != "runc version "+pinned {
		t.Errorf("%s reports %q; want runc version %s", opts.BinaryName, first, pinned)
	}
	if !strings.Contains(string(out), "libseccomp") {
		t.Errorf("%s was built without seccomp:\n%s", opts.BinaryName, out)
	}
	healthy(t, rt)
}
