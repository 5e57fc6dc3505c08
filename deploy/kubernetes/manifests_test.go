package kubernetes_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/kilnrun/kiln/sandbox"
	ktrace "github.com/kilnrun/kiln/trace"
)

// kustomization mirrors the kustomize fields the folder uses.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images"`
}

// scaledObject mirrors the fields of KEDA's keda.sh/v1alpha1 ScaledObject
// that the manifests use (KEDA's own Go module would pull in most of
// Kubernetes' controller stack for one struct).
type scaledObject struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion,omitempty"`
			Kind       string `json:"kind,omitempty"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		PollingInterval *int32 `json:"pollingInterval,omitempty"`
		CooldownPeriod  *int32 `json:"cooldownPeriod,omitempty"`
		MinReplicaCount *int32 `json:"minReplicaCount,omitempty"`
		MaxReplicaCount *int32 `json:"maxReplicaCount,omitempty"`
		Triggers        []struct {
			Type     string            `json:"type"`
			Name     string            `json:"name,omitempty"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

// natsValues mirrors the official NATS chart's values that nats-values.yaml sets.
type natsValues struct {
	Config struct {
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		JetStream struct {
			Enabled   bool `json:"enabled"`
			FileStore struct {
				Enabled bool `json:"enabled"`
				PVC     struct {
					Enabled bool   `json:"enabled"`
					Size    string `json:"size"`
				} `json:"pvc"`
			} `json:"fileStore"`
		} `json:"jetstream"`
		Monitor struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"monitor"`
		Merge struct {
			Authorization struct {
				Token string `json:"token"`
			} `json:"authorization"`
		} `json:"merge"`
	} `json:"config"`
	Container struct {
		Image struct {
			Tag string `json:"tag"`
		} `json:"image"`
		Env map[string]struct {
			ValueFrom *corev1.EnvVarSource `json:"valueFrom"`
		} `json:"env"`
	} `json:"container"`
	NatsBox struct {
		Enabled bool `json:"enabled"`
	} `json:"natsBox"`
	PodTemplate struct {
		TopologySpreadConstraints map[string]struct {
			MaxSkew           int    `json:"maxSkew"`
			WhenUnsatisfiable string `json:"whenUnsatisfiable"`
		} `json:"topologySpreadConstraints"`
	} `json:"podTemplate"`
}

// newObject returns an empty Go value of the API type for apiVersion/kind.
func newObject(apiVersion, kind string) (any, error) {
	switch apiVersion + "/" + kind {
	case "v1/Namespace":
		return &corev1.Namespace{}, nil
	case "v1/ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "v1/Secret":
		return &corev1.Secret{}, nil
	case "v1/Service":
		return &corev1.Service{}, nil
	case "apps/v1/Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1/StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "policy/v1/PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "autoscaling/v2/HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "networking.k8s.io/v1/NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "keda.sh/v1alpha1/ScaledObject":
		return &scaledObject{}, nil
	}
	return nil, fmt.Errorf("no Go type for apiVersion %q kind %q", apiVersion, kind)
}

// decodeStrict decodes one YAML document into its API type; unknown fields
// and duplicate keys are errors.
func decodeStrict(doc []byte) (any, error) {
	_, obj, err := decodeNamed(doc)
	return obj, err
}

// decodeNamed is decodeStrict that also returns "Kind/name".
func decodeNamed(doc []byte) (string, any, error) {
	var head struct {
		metav1.TypeMeta `json:",inline"`
		Metadata        struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return "", nil, fmt.Errorf("read apiVersion/kind: %w", err)
	}
	obj, err := newObject(head.APIVersion, head.Kind)
	if err != nil {
		return "", nil, err
	}
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return "", nil, fmt.Errorf("%s: %w", head.Kind, err)
	}
	return head.Kind + "/" + head.Metadata.Name, obj, nil
}

// splitDocs splits a multi-document YAML file, dropping empty documents.
func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(b, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(d))) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(append(out, line...), '\n')
		}
	}
	return out
}

// manifests is every object of every resource the kustomization lists.
type manifests struct {
	kust       kustomization
	objects    []any
	nats       natsValues
	byKindName map[string]any // "Kind/name"
}

func load(t *testing.T) manifests {
	t.Helper()
	var m manifests
	b, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &m.kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	m.byKindName = map[string]any{}
	for _, res := range m.kust.Resources {
		b, err := os.ReadFile(res)
		if err != nil {
			t.Fatalf("kustomization lists %s: %v", res, err)
		}
		for i, doc := range splitDocs(b) {
			name, obj, err := decodeNamed(doc)
			if err != nil {
				t.Fatalf("%s document %d: %v", res, i+1, err)
			}
			if _, dup := m.byKindName[name]; dup {
				t.Fatalf("%s: %s is defined twice", res, name)
			}
			m.objects = append(m.objects, obj)
			m.byKindName[name] = obj
		}
	}
	b, err = os.ReadFile("nats-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &m.nats); err != nil {
		t.Fatalf("nats-values.yaml: %v", err)
	}
	return m
}

func get[T any](t *testing.T, m manifests, kind, name string) T {
	t.Helper()
	obj, ok := m.byKindName[kind+"/"+name].(T)
	if !ok {
		t.Fatalf("no %s %q in the manifests (have %v)", kind, name, keys(m.byKindName))
	}
	return obj
}

func keys(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestEveryManifestIsListedAndDecodesStrictly(t *testing.T) {
	m := load(t)
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "kustomization.yaml" || f == "nats-values.yaml" {
			continue
		}
		if !slices.Contains(m.kust.Resources, f) {
			t.Errorf("%s is not listed in kustomization.yaml resources", f)
		}
	}
	if len(m.objects) < 10 {
		t.Errorf("decoded %d objects; expected the namespace, config, secret, API, workers, autoscaling and Redis", len(m.objects))
	}
}

func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	// The check the other tests rely on: a misspelled field must fail.
	doc := []byte("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 2\n")
	if _, err := decodeStrict(doc); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("decodeStrict accepted an unknown field: err = %v", err)
	}
	doc = []byte("apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\nmetadata:\n  name: x\nspec:\n  scaleTargetRef: {name: x}\n  maxReplicas: 3\n")
	if _, err := decodeStrict(doc); err == nil {
		t.Fatal("decodeStrict accepted an unknown ScaledObject field")
	}
}

func TestSelectorsMatchTheirPods(t *testing.T) {
	m := load(t)
	podLabels := map[string]labels.Set{} // workload name -> pod template labels
	for _, obj := range m.objects {
		var sel *metav1.LabelSelector
		var tmpl map[string]string
		var name string
		switch o := obj.(type) {
		case *appsv1.Deployment:
			sel, tmpl, name = o.Spec.Selector, o.Spec.Template.Labels, o.Name
		case *appsv1.StatefulSet:
			sel, tmpl, name = o.Spec.Selector, o.Spec.Template.Labels, o.Name
		default:
			continue
		}
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatalf("%s selector: %v", name, err)
		}
		if !s.Matches(labels.Set(tmpl)) {
			t.Errorf("%s: selector %v does not match its pod template's labels %v", name, s, tmpl)
		}
		podLabels[name] = tmpl
	}
	matchesSome := func(sel labels.Selector) bool {
		for _, l := range podLabels {
			if sel.Matches(l) {
				return true
			}
		}
		return false
	}
	for _, obj := range m.objects {
		switch o := obj.(type) {
		case *corev1.Service:
			if !matchesSome(labels.SelectorFromSet(o.Spec.Selector)) {
				t.Errorf("Service %s selects no pods: %v", o.Name, o.Spec.Selector)
			}
		case *policyv1.PodDisruptionBudget:
			s, err := metav1.LabelSelectorAsSelector(o.Spec.Selector)
			if err != nil || !matchesSome(s) {
				t.Errorf("PodDisruptionBudget %s selects no pods (%v)", o.Name, err)
			}
		case *autoscalingv2.HorizontalPodAutoscaler:
			get[*appsv1.Deployment](t, m, "Deployment", o.Spec.ScaleTargetRef.Name)
		}
	}
	api := get[*appsv1.Deployment](t, m, "Deployment", "kiln-api")
	get[*policyv1.PodDisruptionBudget](t, m, "PodDisruptionBudget", "kiln-api")
	hpa := get[*autoscalingv2.HorizontalPodAutoscaler](t, m, "HorizontalPodAutoscaler", "kiln-api")
	if hpa.Spec.ScaleTargetRef.Name != api.Name || hpa.Spec.ScaleTargetRef.Kind != "Deployment" {
		t.Errorf("the API's HPA targets %+v", hpa.Spec.ScaleTargetRef)
	}
}

// TestKEDATriggerMatchesTheQueue: one trigger per runtime the worker
// serves, each reading that runtime's backlog gauge as the API exports it
// (autoscaling_test.go runs the queries against a live API).
func TestKEDATriggerMatchesTheQueue(t *testing.T) {
	m := load(t)
	so := get[*scaledObject](t, m, "ScaledObject", "kiln-worker")
	ref := so.Spec.ScaleTargetRef
	if ref.Kind != "Deployment" || ref.Name != "kiln-worker" {
		t.Fatalf("ScaledObject scales %s %q; want the worker Deployment", ref.Kind, ref.Name)
	}
	get[*appsv1.Deployment](t, m, "Deployment", ref.Name)
	byRuntime := map[string]string{}
	allowed := []string{"serverAddress", "query", "threshold", "activationThreshold", "ignoreNullValues"}
	for _, tr := range so.Spec.Triggers {
		if tr.Type != "prometheus" {
			t.Fatalf("trigger %q has type %q; want prometheus (a nats-jetstream trigger reads one consumer, and each tenant has its own)", tr.Name, tr.Type)
		}
		for k := range tr.Metadata {
			if !slices.Contains(allowed, k) {
				t.Errorf("trigger %q: metadata %q is not a prometheus scaler parameter (%v)", tr.Name, k, allowed)
			}
		}
		if tr.Metadata["threshold"] == "" || tr.Metadata["serverAddress"] == "" {
			t.Errorf("trigger %q has no threshold or serverAddress", tr.Name)
		}
		byRuntime[tr.Name] = tr.Metadata["query"]
	}
	for _, rt := range sandbox.RuntimesDefault() {
		want := fmt.Sprintf("max(%s{kiln_runtime=%q})", ktrace.MetricQueuePending, rt)
		if got, ok := byRuntime[rt]; !ok || got != want {
			t.Errorf("runtime %s: trigger query %q; want %q", rt, got, want)
		}
	}
	if len(byRuntime) != len(sandbox.RuntimesDefault()) {
		t.Errorf("triggers for %v; the worker serves %v", keys(anyMap(byRuntime)), sandbox.RuntimesDefault())
	}
}

func anyMap[V any](m map[string]V) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func TestStreamSettingsAgreeWithTheNATSCluster(t *testing.T) {
	m := load(t)
	cfg := get[*corev1.ConfigMap](t, m, "ConfigMap", "kiln-config")
	n := m.nats.Config
	if !n.JetStream.Enabled || !n.Cluster.Enabled || n.Cluster.Replicas != 3 {
		t.Fatalf("nats-values.yaml: jetstream %v, cluster %v with %d replicas; want a three-node JetStream cluster", n.JetStream.Enabled, n.Cluster.Enabled, n.Cluster.Replicas)
	}
	if got := cfg.Data["KILN_QUEUE_REPLICAS"]; got != fmt.Sprint(n.Cluster.Replicas) {
		t.Errorf("KILN_QUEUE_REPLICAS = %q; the NATS cluster has %d servers", got, n.Cluster.Replicas)
	}
	for _, name := range []string{"kiln-api", "kiln-worker"} {
		d := get[*appsv1.Deployment](t, m, "Deployment", name)
		c := d.Spec.Template.Spec.Containers[0]
		if urls := strings.Split(envOf(c)["KILN_NATS_URL"].Value, ","); len(urls) != n.Cluster.Replicas {
			t.Errorf("%s: KILN_NATS_URL names %d servers; the cluster has %d", name, len(urls), n.Cluster.Replicas)
		}
		if !slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
			return e.ConfigMapRef != nil && e.ConfigMapRef.Name == cfg.Name
		}) {
			t.Errorf("%s does not take its environment from ConfigMap %s", name, cfg.Name)
		}
	}
}

func TestWorkerHasExactlyWhatItNeeds(t *testing.T) {
	m := load(t)
	d := get[*appsv1.Deployment](t, m, "Deployment", "kiln-worker")
	pod := d.Spec.Template.Spec
	if len(pod.NodeSelector) == 0 || len(pod.Tolerations) == 0 {
		t.Error("workers must be pinned to dedicated nodes (nodeSelector and a toleration)")
	}
	if pod.HostPID || pod.HostNetwork || pod.HostIPC {
		t.Error("workers need no host PID, network or IPC namespace")
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		t.Errorf("worker security context %+v: want unprivileged with every capability dropped", sc)
	}
	hostPaths := map[string]string{} // volume -> host path
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mounted := map[string]string{} // host path -> mount path
	for _, vm := range c.VolumeMounts {
		if hp, ok := hostPaths[vm.Name]; ok {
			mounted[hp] = vm.MountPath
		}
	}
	// The shim opens the FIFOs by path: same path inside and out.
	if mounted["/run/containerd"] != "/run/containerd" {
		t.Errorf("host /run/containerd mounted at %q; want the same path", mounted["/run/containerd"])
	}
	if len(hostPaths) != 2 {
		t.Errorf("worker mounts host paths %v; want /run/containerd and /sys/fs/cgroup only", hostPaths)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if id := env["KILN_WORKER_ID"]; id.ValueFrom == nil || id.ValueFrom.FieldRef == nil || id.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("KILN_WORKER_ID must be the pod name (unique per live worker): %+v", id)
	}
	if env["KILN_CONTAINERD_ADDRESS"].Value != "/run/containerd/containerd.sock" {
		t.Errorf("KILN_CONTAINERD_ADDRESS = %q", env["KILN_CONTAINERD_ADDRESS"].Value)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g <= 120 {
		t.Errorf("terminationGracePeriodSeconds %v must exceed the 2m drain timeout", g)
	}
}

func TestAPIReadsItsKeysFromTheSecret(t *testing.T) {
	m := load(t)
	d := get[*appsv1.Deployment](t, m, "Deployment", "kiln-api")
	c := d.Spec.Template.Spec.Containers[0]
	var file string
	for _, e := range c.Env {
		if e.Name == "KILN_API_KEYS_FILE" {
			file = e.Value
		}
	}
	dir, key := filepath.Split(file)
	if key != "keys" {
		t.Fatalf("KILN_API_KEYS_FILE=%q; docs/deployment.md tells operators to create the Secret with key \"keys\"", file)
	}
	var vol string
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == "kiln-api-keys" {
			if v.Secret.Optional != nil && *v.Secret.Optional {
				t.Error("the API keys Secret must not be optional: without it the API would run with authentication off")
			}
			vol = v.Name
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
		return vm.Name == vol && filepath.Clean(vm.MountPath) == filepath.Clean(dir)
	}) {
		t.Errorf("the Secret kiln-api-keys is not mounted at %s", dir)
	}
	for _, probe := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
		if probe == nil || probe.HTTPGet == nil {
			t.Fatal("the API needs HTTP readiness and liveness probes")
		}
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes %s, %s; want /readyz and /healthz", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
	}
}
