// Package cluster holds the multi-server fault tests: Kiln on a three-node
// JetStream cluster whose nodes are real child processes (killed, restarted)
// and on Redis behind Sentinel. Only tests live here.
package cluster
