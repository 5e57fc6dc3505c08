package worker

import (
	"context"
	"log/slog"
	"net"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kilnrun/kiln/internal/sandboxapi"
	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/job/egressrule"
	"github.com/kilnrun/kiln/worker/egress"
)

// jobNetwork is the Network a run of m (a job, or a session's call) gets:
// its egress proxy, on the listener the sandbox makes in the run's own
// network namespace. Every worker offers it; the sandbox still refuses a
// network where its isolation cannot give one.
type jobNetwork struct {
	p      *egressProxies
	jobCtx context.Context // the run's: its span, its log's context
	log    *slog.Logger
	m      job.Message
	audit  *runAudit // the run's audit records
}

// egressProxies makes the runs' egress proxies (worker/egress), each with
// its run's allowlist, span events and audit records.
type egressProxies struct {
	testHosts *egress.TestHosts // Config.EgressTestHosts
}

// network is the Network a run of m gets (jobNetwork).
func (e *egressProxies) network(jobCtx context.Context, log *slog.Logger, m job.Message, a *runAudit) sandboxapi.Network {
	return jobNetwork{p: e, jobCtx: jobCtx, log: log, m: m, audit: a}
}

// Enabled is true: the worker serves every job's network with its proxy.
func (n jobNetwork) Enabled() bool { return true }

// Serve is the run's egress proxy on ln until ctx ends.
func (n jobNetwork) Serve(ctx context.Context, ln net.Listener) *job.Egress {
	return n.p.serve(ctx, n.jobCtx, n.log, n.m, n.audit, ln)
}

// serve is a job's egress proxy (its jobNetwork): the job's
// allowlist, as the producer checked it against the tenant's, served on ln
// until ectx ends. Every connection becomes an event on the job's span and
// a record of the run's audit (a, which folds refusals into one record per
// kind); the result carries the summary.
func (e *egressProxies) serve(ectx, jobCtx context.Context, log *slog.Logger, m job.Message, a *runAudit, ln net.Listener) *job.Egress {
	var allow egressrule.Rules
	if m.Spec.Network != nil {
		rules, err := egressrule.ParseRules(strings.Join(m.Spec.Network.Allow, ","))
		if err != nil {
			// The producer checked it; a job that still fails is refused
			// everything, and says why in every refusal it gets.
			log.WarnContext(jobCtx, "the job's egress allowlist does not parse; every connection is refused", slog.Any("error", err))
		}
		allow = rules
	}
	span := trace.SpanFromContext(jobCtx)
	var p *egress.Proxy
	p = egress.New(egress.Config{
		Allow:     allow,
		TestHosts: e.testHosts,
		Log:       log,
		OnRecord: func(r egress.Record) {
			span.AddEvent("kiln.egress.connection", trace.WithTimestamp(r.Time), trace.WithAttributes(
				attribute.String("kiln.egress.method", r.Method), attribute.String("kiln.egress.host", r.Host),
				attribute.Int("kiln.egress.port", r.Port), attribute.String("kiln.egress.addr", r.Addr),
				attribute.Bool("kiln.egress.allowed", r.Allowed), attribute.String("kiln.egress.reason", r.Reason),
				attribute.Int64("kiln.egress.bytes_up", r.BytesUp), attribute.Int64("kiln.egress.bytes_down", r.BytesDown),
				attribute.Int64("kiln.egress.duration_ms", r.DurationMS)))
			a.egress(m.Spec.Runtime, r, p.CapRefusal(r))
		},
	})
	if err := p.Serve(ectx, ln); err != nil {
		log.WarnContext(jobCtx, "the job's egress proxy", slog.Any("error", err))
	}
	return p.Egress()
}
