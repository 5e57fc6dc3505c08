package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// A box's next inner sandbox is made ahead of its job, while the box is
// idle: the zygote forks it, makes its namespaces and mounts, and its
// process drops to its uid, installs the job filter and sets its rlimits,
// then waits for a frame. The job that takes the box says go and writes its
// frame: the forks and the setup are off its path. The prepared sandbox has
// never seen a job, so it is as fresh as one made at delivery; a job whose
// limits differ from those it was made for (or that has a network, whose
// proxy listener is made in the sandbox's namespace for it) discards it and
// gets one made at delivery.

// preparedJob is an inner sandbox waiting for its job.
type preparedJob struct {
	params boxParams // what it was made of, its uid and work dir included
	jw     *jobWork
	pipes  *boxPipes // the worker's ends; the job's were sent with the header
}

// close releases the worker's side of a prepared sandbox that no job will
// use (its processes end with the box, or were killed by a discard).
func (p *preparedJob) close(b *boxClient, ctx context.Context) {
	for _, f := range p.pipes.ours() {
		f.Close()
	}
	p.jw.remove(b, ctx)
}

// prepareNext makes sb's next inner sandbox for a job with parameters p
// (those of the job that just ended: a tenant's jobs mostly share their
// limits). An error means the control connection failed: retire the box.
func (b *boxClient) prepareNext(ctx context.Context, sb *sandbox, p boxParams) error {
	if b.boxCfg.AtDelivery || sb.box.next != nil {
		return nil
	}
	jw, err := newJobWork(sb)
	if err != nil {
		jw.remove(b, ctx)
		return err
	}
	pipes, err := newBoxPipes()
	if err != nil {
		jw.remove(b, ctx)
		return err
	}
	p.UID, p.Work, p.Prepare, p.EgressPort = jw.uid, jw.name, true, 0
	prep := &preparedJob{params: p, jw: jw, pipes: pipes}
	if err := sendBoxHeader(sb, p, pipes, nil); err != nil {
		prep.close(b, ctx)
		return err
	}
	sb.box.next = prep
	return nil
}

// takePrepared returns sb's prepared sandbox when it was made for a job
// with parameters p (its uid and work dir aside) and the job needs no
// sandbox made for it alone (network); otherwise it discards it and returns
// nil. An error means the box no longer answers as it should: retire it.
func (b *boxClient) takePrepared(ctx context.Context, sb *sandbox, p boxParams, network bool) (*preparedJob, error) {
	prep := sb.box.next
	if prep == nil {
		return nil, nil
	}
	sb.box.next = nil
	want := p
	want.UID, want.Work, want.Prepare = prep.params.UID, prep.params.Work, true
	if want == prep.params && !network {
		b.boxes.Prepared()
		return prep, nil
	}
	b.boxes.Discarded()
	return nil, b.discardPrepared(ctx, sb, prep)
}

// discardPrepared has the zygote kill a prepared sandbox and waits for its
// answer.
func (b *boxClient) discardPrepared(ctx context.Context, sb *sandbox, prep *preparedJob) error {
	defer prep.close(b, ctx)
	if err := sendBoxCmd(sb, "x"); err != nil {
		return fmt.Errorf("sandbox: box %s: discard its prepared sandbox: %w", sb.id, err)
	}
	_ = sb.box.ctl.SetReadDeadline(time.Now().Add(boxKillGrace))
	line, err := sb.box.ctlReader.ReadBytes('\n')
	_ = sb.box.ctl.SetReadDeadline(time.Time{})
	if err == nil && !bytes.Contains(line, []byte(`"discarded"`)) {
		err = errors.New("the zygote answered " + string(bytes.TrimSpace(line)))
	}
	if err != nil {
		return fmt.Errorf("sandbox: box %s: discard its prepared sandbox: %w", sb.id, err)
	}
	b.log.DebugContext(ctx, "box: discarded a prepared sandbox made for other limits", slog.String("container_id", sb.id))
	return nil
}
