// Package egressrule is the grammar of egress allowlists, part of the wire
// contract: Rule and Rules (host names and "*." suffixes, with ports), how
// they are written in a key file or a job's spec (ParseRules, String),
// whether one allows a host and port (Allows), and whether a job's rules
// stay within its tenant's (Within). The producer checks a job's and a
// tenant's rules with it at submission, `kiln keys` reads them from key
// files, and the worker's egress proxy (worker/egress) enforces them.
//
// Seam: plain values and pure functions; NormalHost and ValidName are the
// one normalization of a host name the proxy compares with.
//
// Invariants: a leaf under job (it imports nothing of Kiln's) that does no
// I/O; IP addresses are never a rule (the proxy resolves a name itself).
package egressrule
