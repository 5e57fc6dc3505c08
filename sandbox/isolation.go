package sandbox

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/kilnrun/kiln/sandbox/runtimes"
)

// Isolation names what stands between a sandbox's program and the host
// kernel. It is chosen per runtime (runtimes.Profile.Isolation, or the worker's
// Config.Isolation override), never per job.
type Isolation string

const (
	// IsolationRunc runs the program on the host kernel in runc's
	// namespaces and cgroups, behind Kiln's seccomp profile. The default.
	IsolationRunc Isolation = "runc"
	// IsolationGVisor runs the program on gVisor's user-space kernel
	// (runsc), driven by containerd's runc-v2 shim through a wrapper that
	// adds runsc's global flags (RunscDefault). The host kernel sees only
	// gVisor's sentry and gofer, behind gVisor's own seccomp filters.
	IsolationGVisor Isolation = "gvisor"
)

// isolations lists the valid values, for errors.
var isolations = []Isolation{IsolationRunc, IsolationGVisor}

// parseIsolation checks an isolation name; "" is IsolationRunc.
func parseIsolation(s string) (Isolation, error) {
	if s == "" {
		return IsolationRunc, nil
	}
	if slices.Contains(isolations, Isolation(s)) {
		return Isolation(s), nil
	}
	names := make([]string, len(isolations))
	for i, v := range isolations {
		names[i] = string(v)
	}
	return "", fmt.Errorf("unknown isolation %q (known: %s)", s, strings.Join(names, ", "))
}

// IsolationFor parses the worker's --isolation flag values ("runtime=isolation",
// e.g. "python=gvisor") into Config.Isolation.
func IsolationFor(pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pairs {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		name, iso, ok := strings.Cut(p, "=")
		if !ok || !runtimeName.MatchString(name) {
			return nil, fmt.Errorf("sandbox: isolation %q: want runtime=isolation, e.g. python=gvisor", p)
		}
		if _, err := parseIsolation(iso); err != nil {
			return nil, fmt.Errorf("sandbox: isolation of runtime %s: %w", name, err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("sandbox: isolation of runtime %s is given twice", name)
		}
		out[name] = iso
	}
	return out, nil
}

// isolationOf is the isolation a runtime runs under: the worker's override
// when it has one, else the image's profile, else runc.
func (c Config) isolationOf(runtime string, p runtimes.Profile) (Isolation, error) {
	if s, ok := c.Isolation[runtime]; ok {
		return parseIsolation(s)
	}
	return parseIsolation(p.Isolation)
}

// binaryFor is the OCI runtime binary the runc-v2 shim runs for isolation.
func (c Config) binaryFor(iso Isolation) string {
	if iso == IsolationGVisor {
		return c.Runsc
	}
	return c.Runc
}

// usesGVisor reports whether any runtime is forced onto gVisor by Config.Isolation.
func (c Config) usesGVisor() bool {
	return slices.Contains(slices.Collect(maps.Values(c.Isolation)), string(IsolationGVisor))
}
