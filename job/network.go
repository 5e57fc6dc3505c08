package job

import "time"

// Network is a job's (or a session's) way out to named hosts: an allowlist
// of host names ("api.example.org", "*.data.gov", an optional ":port"),
// each within what its tenant's key allows. Nil or an empty Allow: no
// network at all, the default. A job with a network is part of the cache
// key by its allowlist, and is answered from the cache only when it asks
// (an explicit "cache" policy): what a host returns can change.
type Network struct {
	Allow []string `json:"allow,omitempty"`
}

// MaxNetworkAllow bounds the entries of a job's allowlist.
const MaxNetworkAllow = 64

// Empty reports whether n allows nothing.
func (n *Network) Empty() bool { return n == nil || len(n.Allow) == 0 }

// Egress is what a job did through its egress proxy: a summary and one
// record per connection it asked for, refused ones included.
type Egress struct {
	Connections int   `json:"connections"`
	Refused     int   `json:"refused"`
	BytesUp     int64 `json:"bytes_up"`
	BytesDown   int64 `json:"bytes_down"`
	// Records are the job's connections in the order they ended, at most
	// MaxEgressRecords (RecordsDropped counts the rest; the summary
	// counts them all).
	Records        []EgressRecord `json:"records,omitempty"`
	RecordsDropped int            `json:"records_dropped,omitempty"`
}

// MaxEgressRecords bounds the records a result carries.
const MaxEgressRecords = 64

// EgressRecord is one connection a job asked its proxy for: what it named,
// where the proxy connected, how much went each way, and why it was refused
// or cut.
type EgressRecord struct {
	Time time.Time `json:"time"`
	// Method is CONNECT (a tunnel, TLS) or the plain HTTP request's method.
	Method     string `json:"method"`
	Host       string `json:"host"`
	Port       int    `json:"port"`
	Addr       string `json:"addr,omitempty"` // the address connected to
	Allowed    bool   `json:"allowed"`
	Reason     string `json:"reason,omitempty"` // why it was refused or cut
	BytesUp    int64  `json:"bytes_up"`
	BytesDown  int64  `json:"bytes_down"`
	DurationMS int64  `json:"duration_ms"`
}
