// Package cluster holds the multi-server fault tests: Kiln on a three-node
// JetStream cluster whose nodes are real child processes (killed,
// restarted), and on Redis behind Sentinel through a failover. Only tests
// live here.
//
// Seam: internal/testenv starts the servers; the producer and workers run in
// process against them.
//
// Invariants it checks: across a stream leader's death, a rolling restart
// and a Redis failover, no job is lost, none runs twice and none is left
// non-terminal.
package cluster
