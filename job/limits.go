package job

import (
	"fmt"
	"time"
)

// Limits bound one run. A zero field means "use the server default";
// a negative field, or one above the server maximum, is rejected.
type Limits struct {
	TimeoutMS   int64 `json:"timeout_ms,omitempty"`   // wall clock, from delivery to exit
	MemoryMB    int64 `json:"memory_mb,omitempty"`    // memory+swap of the whole container
	CPUMS       int64 `json:"cpu_ms,omitempty"`       // CPU time (RLIMIT_CPU, rounded up to whole seconds)
	Pids        int64 `json:"pids,omitempty"`         // processes and threads at once
	OutputBytes int64 `json:"output_bytes,omitempty"` // kept per stream; the rest is drained and counted
	DiskMB      int64 `json:"disk_mb,omitempty"`      // tmpfs size of /tmp and of the work dir (each)
}

// Timeout returns TimeoutMS as a duration.
func (l Limits) Timeout() time.Duration { return time.Duration(l.TimeoutMS) * time.Millisecond }

// DefaultLimits are applied to zero fields unless the server is configured otherwise.
var DefaultLimits = Limits{
	TimeoutMS:   10_000,
	MemoryMB:    256,
	CPUMS:       10_000,
	Pids:        64,
	OutputBytes: 1 << 20,
	DiskMB:      64,
}

// MaxLimits are the largest values a spec may ask for unless the server is configured otherwise.
var MaxLimits = Limits{
	TimeoutMS:   300_000,
	MemoryMB:    4096,
	CPUMS:       300_000,
	Pids:        1024,
	OutputBytes: 16 << 20,
	DiskMB:      1024,
}

// MinLimits are the smallest values a spec may ask for unless the server is
// configured otherwise; a zero field has no minimum. memory_mb: below it the
// sandbox cannot start the runtime at all (the python image's interpreter,
// launcher and init were measured to need MinMemoryMB), which would end as
// the platform's error instead of the program's.
var MinLimits = Limits{MemoryMB: MinMemoryMB}

// MinMemoryMB is the default minimum of limits.memory_mb.
const MinMemoryMB = 16

// Policy holds a server's default, minimum and maximum limits.
type Policy struct {
	Default Limits `json:"default"`
	Max     Limits `json:"max"`
	// Min: a zero field has no minimum.
	Min Limits `json:"min"`
}

// DefaultPolicy is DefaultLimits, MaxLimits and MinLimits.
func DefaultPolicy() Policy { return Policy{Default: DefaultLimits, Max: MaxLimits, Min: MinLimits} }

type limitField struct {
	name string
	get  func(*Limits) *int64
}

var limitFields = []limitField{
	{"timeout_ms", func(l *Limits) *int64 { return &l.TimeoutMS }},
	{"memory_mb", func(l *Limits) *int64 { return &l.MemoryMB }},
	{"cpu_ms", func(l *Limits) *int64 { return &l.CPUMS }},
	{"pids", func(l *Limits) *int64 { return &l.Pids }},
	{"output_bytes", func(l *Limits) *int64 { return &l.OutputBytes }},
	{"disk_mb", func(l *Limits) *int64 { return &l.DiskMB }},
}

// Validate checks that the policy itself is coherent: every default positive and within its maximum.
func (p Policy) Validate() error {
	for _, f := range limitFields {
		d, m := *f.get(&p.Default), *f.get(&p.Max)
		if d <= 0 || m <= 0 {
			return fmt.Errorf("limit policy: %s default %d and max %d must both be positive", f.name, d, m)
		}
		if d > m {
			return fmt.Errorf("limit policy: %s default %d is above its max %d", f.name, d, m)
		}
		if lo := *f.get(&p.Min); lo < 0 || lo > d {
			return fmt.Errorf("limit policy: %s minimum %d must be between 0 and the default %d", f.name, lo, d)
		}
	}
	return nil
}

// Resolve returns req with every zero field set to the default, or an
// *InvalidError naming the first negative field or field above its maximum.
func (p Policy) Resolve(req Limits) (Limits, error) {
	out := req
	for _, f := range limitFields {
		v := f.get(&out)
		switch {
		case *v < 0:
			return Limits{}, invalid("limits."+f.name, fmt.Sprintf("%s is %d; it must be positive (or omitted for the default %d)", f.name, *v, *f.get(&p.Default)))
		case *v == 0:
			*v = *f.get(&p.Default)
		case *v > *f.get(&p.Max):
			return Limits{}, invalid("limits."+f.name, fmt.Sprintf("%s is %d; the maximum is %d", f.name, *v, *f.get(&p.Max)))
		case *v < *f.get(&p.Min):
			return Limits{}, invalid("limits."+f.name, fmt.Sprintf("%s is %d; the minimum is %d, below which the sandbox cannot start the runtime", f.name, *v, *f.get(&p.Min)))
		}
	}
	return out, nil
}
