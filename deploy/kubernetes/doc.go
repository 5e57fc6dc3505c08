// Package kubernetes checks the Kubernetes manifests in deploy/kubernetes
// (a kustomize base); it holds tests only. No cluster runs here: every
// manifest is decoded strictly with the Kubernetes API's Go types (an
// unknown or misspelled field fails), and the pieces that must agree with
// each other and with the code are compared (manifests_test.go,
// security_test.go); autoscaling_test.go runs each KEDA trigger's query
// against a live API's /metrics.
//
// Seam: the YAML files beside it, and for autoscaling a real producer over
// redis-server and embedded JetStream.
//
// Invariants it checks: selectors match their pods; the worker has what it
// needs and no more; Redis and NATS require credentials from Secrets;
// network policies admit only Kiln; images are pinned; the KEDA triggers
// read the backlog the API reports.
package kubernetes
