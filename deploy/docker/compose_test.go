package docker_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

type compose struct {
	Services map[string]service  `json:"services"`
	Volumes  map[string]struct{} `json:"volumes"`
}

type service struct {
	Image string `json:"image"`
	Build *struct {
		Context    string `json:"context"`
		Dockerfile string `json:"dockerfile"`
	} `json:"build,omitempty"`
	Command     []string          `json:"command,omitempty"`
	Hostname    string            `json:"hostname,omitempty"`
	Environment map[string]string `json:"environment,omitempty"`
	Volumes     []string          `json:"volumes,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
	Profiles    []string          `json:"profiles,omitempty"`
	Restart     string            `json:"restart,omitempty"`
	Healthcheck *healthcheck      `json:"healthcheck,omitempty"`
	DependsOn   map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on,omitempty"`
	StopGracePeriod string `json:"stop_grace_period,omitempty"`
}

type healthcheck struct {
	Test        []string `json:"test"`
	Interval    string   `json:"interval"`
	Timeout     string   `json:"timeout"`
	Retries     int      `json:"retries"`
	StartPeriod string   `json:"start_period"`
}

func load(t *testing.T) compose {
	t.Helper()
	b, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

func TestComposeServices(t *testing.T) {
	c := load(t)
	for _, name := range []string{"nats", "redis", "api", "worker", "jaeger"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("no %s service", name)
		}
	}
	for name, s := range c.Services {
		if s.Restart != "unless-stopped" && s.Restart != "always" {
			t.Errorf("%s: restart %q; want unless-stopped or always", name, s.Restart)
		}
		if name != "jaeger" && (s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD") {
			t.Errorf("%s: no healthcheck", name)
		}
		for dep, d := range s.DependsOn {
			if d.Condition != "service_healthy" {
				t.Errorf("%s waits for %s to be %q; want service_healthy", name, dep, d.Condition)
			}
			if c.Services[dep].Healthcheck == nil {
				t.Errorf("%s waits for %s, which has no healthcheck", name, dep)
			}
		}
	}
}

func TestOnlyTheAPIIsPublished(t *testing.T) {
	c := load(t)
	for name, s := range c.Services {
		switch {
		case name == "api":
			if !slices.Equal(s.Ports, []string{"8080:8080"}) {
				t.Errorf("api publishes %v; want 8080:8080", s.Ports)
			}
		case name == "jaeger":
			if !slices.Contains(s.Profiles, "tracing") {
				t.Error("jaeger must be opt-in (profile tracing)")
			}
			for _, p := range s.Ports {
				if !strings.HasPrefix(p, "127.0.0.1:") {
					t.Errorf("jaeger publishes %s beyond the host's loopback", p)
				}
			}
		case len(s.Ports) > 0:
			t.Errorf("%s publishes %v; only the API may", name, s.Ports)
		}
	}
}

func TestAuthOnAndStableWorkerID(t *testing.T) {
	c := load(t)
	keys := c.Services["api"].Environment["KILN_API_KEYS"]
	if !strings.HasPrefix(keys, "${KILN_API_KEYS:?") {
		t.Errorf("KILN_API_KEYS = %q; compose must refuse to start the API without keys", keys)
	}
	w := c.Services["worker"]
	id := w.Environment["KILN_WORKER_ID"]
	if id == "" || w.Hostname == "" {
		t.Errorf("worker id %q, hostname %q: both must be set and stable", id, w.Hostname)
	}
	if !slices.Contains(w.Volumes, "/run/containerd:/run/containerd") {
		t.Errorf("worker volumes %v: the host's /run/containerd must be mounted at the same path", w.Volumes)
	}
	if w.StopGracePeriod == "" {
		t.Error("worker has no stop_grace_period to drain in")
	}
}
