package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kilnrun/kiln/internal/testkit"
)

// natsNodeEnv, when set in a test binary's environment, makes NATSNodeMain
// run one cluster node described by the variable's JSON (nodeSpec).
const natsNodeEnv = "KILN_TESTENV_NATS_NODE"

// nodeSpec is one node of a test JetStream cluster.
type nodeSpec struct {
	Name        string `json:"name"`
	Port        int    `json:"port"`
	ClusterPort int    `json:"cluster_port"`
	MonitorPort int    `json:"monitor_port"`
	StoreDir    string `json:"store_dir"`
	Routes      []int  `json:"routes"` // cluster ports of every node
}

// NATSNodeMain runs a cluster node and exits when the test binary was
// started as one (see NATSCluster); otherwise it returns at once. Call it
// first thing in TestMain of a package that uses StartNATSCluster.
func NATSNodeMain() {
	raw := os.Getenv(natsNodeEnv)
	if raw == "" {
		return
	}
	var spec nodeSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "nats node:", err)
		os.Exit(2)
	}
	os.Exit(runNATSNode(spec))
}

func runNATSNode(spec nodeSpec) int {
	var routes []string
	for _, p := range spec.Routes {
		if p != spec.ClusterPort {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", p))
		}
	}
	opts := &server.Options{
		ServerName: spec.Name, Host: "127.0.0.1", Port: spec.Port, HTTPHost: "127.0.0.1", HTTPPort: spec.MonitorPort,
		JetStream: true, StoreDir: spec.StoreDir, NoSigs: true, NoLog: true,
		Cluster: server.ClusterOpts{Name: "kiln-test", Host: "127.0.0.1", Port: spec.ClusterPort},
		Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nats node:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv.SetLogger(errorsOnly{}, false, false) // why a node did not come up
	go srv.Start()
	if !srv.ReadyForConnections(20 * time.Second) {
		fmt.Fprintln(os.Stderr, "nats node: not ready within 20s")
		return 1
	}
	<-ctx.Done()
	// SIGTERM: a clean shutdown, as a rolling restart does it. (Lame-duck
	// mode would wait minutes; Shutdown hands leadership over at once.)
	srv.Shutdown()
	srv.WaitForShutdown()
	return 0
}

// errorsOnly is a node's server logger: its errors and fatal errors go to
// stderr (a port it could not bind, a store it could not open), the rest
// nowhere.
type errorsOnly struct{}

func (errorsOnly) Noticef(string, ...any) {}
func (errorsOnly) Warnf(string, ...any)   {}
func (errorsOnly) Debugf(string, ...any)  {}
func (errorsOnly) Tracef(string, ...any)  {}
func (errorsOnly) Errorf(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "nats node: "+format+"\n", v...)
}
func (errorsOnly) Fatalf(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "nats node: fatal: "+format+"\n", v...)
}

// NATSCluster is a JetStream cluster of real nats-server nodes, each a child
// process (the test binary in node mode) that a test can SIGKILL or restart.
type NATSCluster struct {
	t     testing.TB
	nodes []*natsNode
}

type natsNode struct {
	spec nodeSpec
	cmd  *exec.Cmd
	done chan struct{}
}

// StartNATSCluster starts n nodes on loopback and waits until JetStream has
// a meta leader. The package's TestMain must call NATSNodeMain.
func StartNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	c := &NATSCluster{t: t}
	var cports []int
	for range n {
		cports = append(cports, FreePort(t))
	}
	dir := t.TempDir()
	for i := range n {
		c.nodes = append(c.nodes, &natsNode{spec: nodeSpec{
			Name: fmt.Sprintf("n%d", i+1), Port: FreePort(t), ClusterPort: cports[i], MonitorPort: FreePort(t),
			StoreDir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)), Routes: cports,
		}})
	}
	// Before any node starts: a node that does not come up ends the test
	// at once, and the nodes started before it must not outlive it.
	t.Cleanup(func() {
		for i := range c.nodes {
			c.Kill(i)
		}
	})
	for i := range c.nodes {
		c.Start(i)
	}
	c.WaitJetStream(30 * time.Second)
	return c
}

// URLs is every node's client URL, comma-separated (what KILN_NATS_URL takes).
func (c *NATSCluster) URLs() string {
	var u []string
	for _, n := range c.nodes {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", n.spec.Port))
	}
	return strings.Join(u, ",")
}

// Name is node i's server name (as JetStream reports leaders).
func (c *NATSCluster) Name(i int) string { return c.nodes[i].spec.Name }

// Index returns the node named name, or -1.
func (c *NATSCluster) Index(name string) int {
	for i, n := range c.nodes {
		if n.spec.Name == name {
			return i
		}
	}
	return -1
}

// Start starts node i (again) on its ports and store; it waits until the
// node accepts client connections.
func (c *NATSCluster) Start(i int) {
	c.t.Helper()
	n := c.nodes[i]
	if n.cmd != nil {
		return
	}
	raw, _ := json.Marshal(n.spec)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), natsNodeEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start nats node %s: %v", n.spec.Name, err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(n.done) }()
	var err error
	if !testkit.Poll(20*time.Second, func() bool {
		var nc *nats.Conn
		if nc, err = nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", n.spec.Port), nats.NoReconnect()); err != nil {
			return false
		}
		nc.Close()
		return true
	}) {
		c.t.Fatalf("nats node %s not accepting connections within 20s: %v", n.spec.Name, err)
	}
}

// Kill SIGKILLs node i and waits for it to be gone.
func (c *NATSCluster) Kill(i int) { c.signal(i, syscall.SIGKILL) }

// Stop SIGTERMs node i (a clean shutdown) and waits for it to exit.
func (c *NATSCluster) Stop(i int) { c.signal(i, syscall.SIGTERM) }

func (c *NATSCluster) signal(i int, sig syscall.Signal) {
	n := c.nodes[i]
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(sig)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

// WaitJetStream waits until the cluster's JetStream meta group has a leader
// that every node agrees on and all other nodes are current peers of it, so
// a stream can be placed on every node.
func (c *NATSCluster) WaitJetStream(within time.Duration) {
	c.t.Helper()
	var last string
	if !testkit.Poll(within, func() bool {
		ok, why := c.metaReady()
		last = why
		return ok
	}) {
		c.t.Fatalf("JetStream cluster not ready within %v: %s", within, last)
	}
}

// jsz is the part of a node's /jsz monitoring answer WaitJetStream reads.
type jsz struct {
	Meta *struct {
		Leader   string `json:"leader"`
		Replicas []struct {
			Name    string `json:"name"`
			Current bool   `json:"current"`
			Offline bool   `json:"offline"`
		} `json:"replicas"`
	} `json:"meta_cluster"`
}

func (c *NATSCluster) metaReady() (bool, string) {
	hc := http.Client{Timeout: 2 * time.Second}
	leader := ""
	for _, n := range c.nodes {
		if n.cmd == nil {
			return false, n.spec.Name + " is stopped"
		}
		resp, err := hc.Get(fmt.Sprintf("http://127.0.0.1:%d/jsz", n.spec.MonitorPort))
		if err != nil {
			return false, fmt.Sprintf("%s: %v", n.spec.Name, err)
		}
		var v jsz
		err = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		switch {
		case err != nil:
			return false, fmt.Sprintf("%s /jsz: %v", n.spec.Name, err)
		case v.Meta == nil || v.Meta.Leader == "":
			return false, n.spec.Name + " knows no meta leader"
		case leader != "" && v.Meta.Leader != leader:
			return false, fmt.Sprintf("%s sees meta leader %s, another node %s", n.spec.Name, v.Meta.Leader, leader)
		}
		leader = v.Meta.Leader
		if v.Meta.Leader != n.spec.Name {
			continue
		}
		current := 0
		for _, r := range v.Meta.Replicas {
			if r.Current && !r.Offline {
				current++
			}
		}
		if current != len(c.nodes)-1 {
			return false, fmt.Sprintf("meta leader %s has %d current peers of %d", leader, current, len(c.nodes)-1)
		}
	}
	return true, ""
}
