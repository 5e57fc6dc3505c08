package kubernetes_test

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	return env
}

// secretRef is the Secret name/key an env var reads, or "" when it reads none.
func secretRef(e corev1.EnvVar) string {
	if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		return ""
	}
	if o := e.ValueFrom.SecretKeyRef.Optional; o != nil && *o {
		return "" // optional: a pod would start without it
	}
	return e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
}

// Redis and NATS demand credentials, which come only from Secrets the base
// does not hold (so no placeholder of the base is a working credential), and
// the API and workers present them.
func TestRedisAndNATSRequireCredentials(t *testing.T) {
	m := load(t)
	for _, obj := range m.objects {
		if sec, ok := obj.(*corev1.Secret); ok {
			t.Errorf("the base holds Secret %q: a placeholder in it would be a working credential; have operators create it", sec.Name)
		}
	}
	cfg := get[*corev1.ConfigMap](t, m, "ConfigMap", "kiln-config")
	for _, k := range []string{"KILN_REDIS_URL", "KILN_NATS_URL"} {
		if _, ok := cfg.Data[k]; ok {
			t.Errorf("ConfigMap sets %s: without credentials it cannot connect, with them it leaks them", k)
		}
	}

	redis := get[*appsv1.StatefulSet](t, m, "StatefulSet", "redis").Spec.Template.Spec.Containers[0]
	args := strings.Join(redis.Args, " ")
	pass := regexp.MustCompile(`--requirepass \$\((\w+)\)`).FindStringSubmatch(args)
	if pass == nil || secretRef(envOf(redis)[pass[1]]) != "kiln-redis/password" {
		t.Fatalf("redis-server %q must take --requirepass from Secret kiln-redis (key password)", args)
	}
	if secretRef(envOf(redis)["REDISCLI_AUTH"]) != "kiln-redis/password" {
		t.Error("redis's probe (redis-cli) needs REDISCLI_AUTH from the same Secret")
	}

	n := m.nats
	tok := regexp.MustCompile(`^<< \$(\w+) >>$`).FindStringSubmatch(n.Config.Merge.Authorization.Token)
	if tok == nil {
		t.Fatalf("nats-values.yaml: authorization token %q; want << $VAR >> from a Secret", n.Config.Merge.Authorization.Token)
	}
	if e, ok := n.Container.Env[tok[1]]; !ok || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil ||
		e.ValueFrom.SecretKeyRef.Name+"/"+e.ValueFrom.SecretKeyRef.Key != "kiln-nats/token" {
		t.Fatalf("nats-values.yaml: $%s must come from Secret kiln-nats (key token): %+v", tok[1], n.Container.Env)
	}

	for _, name := range []string{"kiln-api", "kiln-worker"} {
		c := get[*appsv1.Deployment](t, m, "Deployment", name).Spec.Template.Spec.Containers[0]
		env := envOf(c)
		if secretRef(env["KILN_REDIS_PASSWORD"]) != "kiln-redis/password" || secretRef(env["KILN_NATS_TOKEN"]) != "kiln-nats/token" {
			t.Errorf("%s: KILN_REDIS_PASSWORD and KILN_NATS_TOKEN must come from the Secrets", name)
		}
		// $(VAR) expands only variables listed earlier.
		pos := map[string]int{}
		for i, e := range c.Env {
			pos[e.Name] = i
		}
		if !strings.HasPrefix(env["KILN_REDIS_URL"].Value, "redis://:$(KILN_REDIS_PASSWORD)@") || pos["KILN_REDIS_URL"] < pos["KILN_REDIS_PASSWORD"] {
			t.Errorf("%s: KILN_REDIS_URL %q must carry $(KILN_REDIS_PASSWORD), listed after it", name, env["KILN_REDIS_URL"].Value)
		}
		for _, u := range strings.Split(env["KILN_NATS_URL"].Value, ",") {
			if !strings.HasPrefix(u, "nats://$(KILN_NATS_TOKEN)@") || pos["KILN_NATS_URL"] < pos["KILN_NATS_TOKEN"] {
				t.Errorf("%s: NATS URL %q must carry $(KILN_NATS_TOKEN), listed after it", name, u)
			}
		}
	}
}

// natsServer and natsBox are the labels the NATS chart gives its pods.
var (
	natsServer = map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats"}
	natsBox    = map[string]string{"app.kubernetes.io/name": "nats", "app.kubernetes.io/instance": "nats", "app.kubernetes.io/component": "nats-box"}
)

// admitted lists the pods (by name, the NATS chart's by component) that the
// policies let reach a pod with podLabels on port, and whether any pod at all
// may (an ingress rule with no from).
func admitted(t *testing.T, m manifests, podLabels map[string]string, port int32) (names []string, anyone bool) {
	t.Helper()
	var sources []map[string]string
	for _, name := range []string{"kiln-api", "kiln-worker"} {
		sources = append(sources, get[*appsv1.Deployment](t, m, "Deployment", name).Spec.Template.Labels)
	}
	sources = append(sources, natsServer, natsBox, map[string]string{"app.kubernetes.io/name": "intruder"})
	for _, obj := range m.objects {
		np, ok := obj.(*networkingv1.NetworkPolicy)
		if !ok || !selects(t, np.Spec.PodSelector, podLabels) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			if !slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.IntVal == port }) && len(rule.Ports) > 0 {
				continue
			}
			if len(rule.From) == 0 {
				return nil, true
			}
			for _, src := range sources {
				for _, peer := range rule.From {
					if peer.PodSelector != nil && peer.NamespaceSelector == nil && peer.IPBlock == nil && selects(t, *peer.PodSelector, src) {
						names = append(names, cmp.Or(src["app.kubernetes.io/component"], src["app.kubernetes.io/name"]))
					} else if peer.PodSelector == nil {
						return nil, true // a namespace or an address block: beyond this check
					}
				}
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), false
}

func selects(t *testing.T, sel metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(&sel)
	if err != nil {
		t.Fatal(err)
	}
	return s.Matches(labels.Set(l))
}

// Only the API and the workers reach Redis and NATS (NATS servers also
// reach each other on the cluster port); everything else in the namespace
// is denied by default.
func TestNetworkPoliciesAdmitOnlyKiln(t *testing.T) {
	m := load(t)
	deny := false
	for _, obj := range m.objects {
		if np, ok := obj.(*networkingv1.NetworkPolicy); ok && len(np.Spec.PodSelector.MatchLabels) == 0 &&
			len(np.Spec.PodSelector.MatchExpressions) == 0 && len(np.Spec.Ingress) == 0 && slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			deny = true
		}
	}
	if !deny {
		t.Error("no default-deny ingress policy for the namespace")
	}
	if m.nats.NatsBox.Enabled {
		t.Error("nats-values.yaml enables nats-box: one more pod that can reach NATS")
	}
	redis := get[*appsv1.StatefulSet](t, m, "StatefulSet", "redis").Spec.Template.Labels
	for _, tc := range []struct {
		what string
		pod  map[string]string
		port int32
		want []string
	}{
		{"redis", redis, 6379, []string{"kiln-api", "kiln-worker"}},
		{"nats clients", natsServer, 4222, []string{"kiln-api", "kiln-worker"}},
		{"nats routes", natsServer, 6222, []string{"nats"}},
	} {
		got, anyone := admitted(t, m, tc.pod, tc.port)
		if anyone || !slices.Equal(got, tc.want) {
			t.Errorf("%s (port %d) admits %v (anyone: %v); want %v", tc.what, tc.port, got, anyone, tc.want)
		}
	}
}

// The replicas of a Deployment an autoscaler owns are not pinned: a
// re-apply would otherwise reset what the HPA or KEDA chose. The worker's
// liveness is /healthz (a TCP check passes for a wedged process), its
// readiness /readyz. Every image is pinned: by digest, or an exact release.
func TestAutoscaledReplicasProbesAndImages(t *testing.T) {
	m := load(t)
	for _, name := range []string{"kiln-api", "kiln-worker"} {
		if d := get[*appsv1.Deployment](t, m, "Deployment", name); d.Spec.Replicas != nil {
			t.Errorf("%s pins replicas: %d; its autoscaler owns the count", name, *d.Spec.Replicas)
		}
	}
	w := get[*appsv1.Deployment](t, m, "Deployment", "kiln-worker").Spec.Template.Spec.Containers[0]
	if p := w.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Errorf("worker liveness probe %+v; want GET /healthz", p)
	}
	if p := w.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("worker readiness probe %+v; want GET /readyz", p)
	}
	digest := regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	exact := regexp.MustCompile(`:\d+\.\d+\.\d+(-[a-z0-9.]+)?(@sha256:[0-9a-f]{64})?$`)
	for _, img := range m.kust.Images {
		if !digest.MatchString(img.Digest) {
			t.Errorf("kustomization image %s: digest %q; pin the image by digest", img.Name, img.Digest)
		}
	}
	for _, obj := range m.objects {
		var pod *corev1.PodSpec
		switch o := obj.(type) {
		case *appsv1.Deployment:
			pod = &o.Spec.Template.Spec
		case *appsv1.StatefulSet:
			pod = &o.Spec.Template.Spec
		default:
			continue
		}
		for _, c := range pod.Containers {
			pinned := slices.ContainsFunc(m.kust.Images, func(i struct {
				Name    string `json:"name"`
				NewName string `json:"newName,omitempty"`
				NewTag  string `json:"newTag,omitempty"`
				Digest  string `json:"digest,omitempty"`
			}) bool {
				return i.Name == c.Image
			})
			if !pinned && !exact.MatchString(c.Image) {
				t.Errorf("container %s runs image %q: not an exact release or digest", c.Name, c.Image)
			}
		}
	}
	if tag := m.nats.Container.Image.Tag; !regexp.MustCompile(`^\d+\.\d+\.\d+`).MatchString(tag) {
		t.Errorf("nats-values.yaml: image tag %q; want an exact release", tag)
	}
}

// The API's HPA scales on CPU utilization, which Kubernetes measures
// against the containers' CPU requests: without them it never scales.
func TestAPIHPAMeasuresWhatTheAPIRequests(t *testing.T) {
	m := load(t)
	hpa := get[*autoscalingv2.HorizontalPodAutoscaler](t, m, "HorizontalPodAutoscaler", "kiln-api")
	d := get[*appsv1.Deployment](t, m, "Deployment", hpa.Spec.ScaleTargetRef.Name)
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 {
		t.Errorf("the API's HPA minReplicas %v; want at least 2 (the PodDisruptionBudget keeps one)", hpa.Spec.MinReplicas)
	}
	if len(hpa.Spec.Metrics) == 0 {
		t.Fatal("the API's HPA has no metric")
	}
	for _, metric := range hpa.Spec.Metrics {
		if metric.Resource == nil || metric.Resource.Target.Type != autoscalingv2.UtilizationMetricType {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if q, ok := c.Resources.Requests[metric.Resource.Name]; !ok || q.IsZero() {
				t.Errorf("the HPA scales on %s utilization but container %s requests no %s", metric.Resource.Name, c.Name, metric.Resource.Name)
			}
		}
	}
}
