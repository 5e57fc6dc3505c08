package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnrun/kiln/sandbox/artifacts"
	"github.com/kilnrun/kiln/sandbox/host"
	"github.com/kilnrun/kiln/sandbox/initproto"
)

// jobOutput is the copying of one box job's stdout and stderr, and the
// reading of its output channel.
type jobOutput struct {
	done chan struct{}
	// channel is what the output channel carried, set before channelDone.
	channel     artifacts.OutputStream
	channelDone atomic.Bool
}

// boxPipes are one job's pipes to its process in a box: stdin, stdout,
// stderr, frame and output channel, each {read, write}. The zygote gets
// the job's ends with the header; the worker keeps the others.
type boxPipes [5][2]*os.File

func newBoxPipes() (*boxPipes, error) {
	var pipes boxPipes
	for i := range pipes {
		var err error
		if pipes[i][0], pipes[i][1], err = os.Pipe(); err != nil {
			for _, pp := range pipes[:i] {
				pp[0].Close()
				pp[1].Close()
			}
			return nil, fmt.Errorf("sandbox: box: %w", err)
		}
	}
	return &pipes, nil
}

// theirs are the ends the job's process holds.
func (p *boxPipes) theirs() []*os.File {
	return []*os.File{p[0][0], p[1][1], p[2][1], p[3][0], p[4][1]}
}

// ours are the ends the worker holds.
func (p *boxPipes) ours() []*os.File {
	return []*os.File{p[0][1], p[1][0], p[2][0], p[3][1], p[4][0]}
}

// sendBoxHeader hands the zygote a job's sandbox: the header with the job's
// ends of its pipes (and the egress channel, if any), then the sandbox's
// parameters. The job's ends are closed here: the zygote holds its own
// copies once sent.
func sendBoxHeader(sb *sandbox, p boxParams, pipes *boxPipes, egress *os.File) error {
	if egress != nil {
		// The zygote's copy is all that is left once sent (or not).
		defer egress.Close()
	}
	defer func() {
		for _, f := range pipes.theirs() {
			f.Close()
		}
	}()
	params, err := p.Encode()
	if err != nil {
		return fmt.Errorf("sandbox: box: %w", err)
	}
	head := initproto.BoxHeader(len(params))
	var fds []int
	for _, f := range pipes.theirs() {
		fds = append(fds, int(f.Fd()))
	}
	if egress != nil {
		fds = append(fds, int(egress.Fd()))
	}
	rights := unix.UnixRights(fds...)
	sb.box.ctlMu.Lock()
	_ = sb.box.ctl.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _, err = sb.box.ctl.WriteMsgUnix(head, rights, nil)
	if err == nil {
		_, err = sb.box.ctl.Write(params)
	}
	sb.box.ctlMu.Unlock()
	if err != nil {
		return fmt.Errorf("sandbox: box %s: send the job: %w", sb.id, err)
	}
	return nil
}

// sendBoxJob hands the zygote a job made at delivery (sendBoxHeader), then
// starts its I/O (startBoxIO).
func (b *boxClient) sendBoxJob(sb *sandbox, p boxParams, frame []byte, stdin string, egress *os.File) (*jobOutput, error) {
	pipes, err := newBoxPipes()
	if err != nil {
		if egress != nil {
			egress.Close()
		}
		return nil, err
	}
	err = sendBoxHeader(sb, p, pipes, egress)
	return startBoxIO(sb, pipes, frame, stdin), err
}

// startBoxIO copies the job's stdout and stderr to the sandbox's buffers,
// reads its output channel, and writes the frame and the job's stdin on
// their pipes (read by the job's own process only, after the fork). It
// takes the worker's ends of the pipes.
func startBoxIO(sb *sandbox, pipes *boxPipes, frame []byte, stdin string) *jobOutput {
	out := &jobOutput{done: make(chan struct{}, 3)}
	go func() {
		// Read as it comes, the rest drained past the bound: the job's
		// launcher never blocks on a full pipe.
		out.channel = artifacts.ReadOutputStream(pipes[4][0], true)
		out.channelDone.Store(true)
		pipes[4][0].Close()
		out.done <- struct{}{}
	}()
	for _, c := range []struct {
		f      *os.File
		stream string
		buf    *cappedBuffer
	}{{pipes[1][0], "stdout", sb.stdout}, {pipes[2][0], "stderr", sb.stderr}} {
		go func() {
			_, _ = io.Copy(streamWriter{sb, c.stream, c.buf}, c.f)
			c.f.Close()
			out.done <- struct{}{}
		}()
	}
	go func() {
		_, _ = pipes[3][1].Write(frame)
		pipes[3][1].Close()
	}()
	go func() {
		if stdin != "" {
			_, _ = io.WriteString(pipes[0][1], stdin)
		}
		pipes[0][1].Close()
	}()
	return out
}

// wait waits for both streams and the output channel to end (every writer
// is dead by now).
func (o *jobOutput) wait(b *boxClient, ctx context.Context, sb *sandbox) {
	if o == nil {
		return
	}
	deadline := time.After(outputDrainTimeout)
	for range 3 {
		select {
		case <-o.done:
		case <-deadline:
			b.log.WarnContext(ctx, "box job output not drained in time", slog.String("container_id", sb.id))
			return
		}
	}
}

// outputs returns what the output channel carried; nothing when the
// channel was not read to its end in time.
func (o *jobOutput) outputs() artifacts.OutputStream {
	if o == nil || !o.channelDone.Load() {
		return artifacts.OutputStream{}
	}
	return o.channel
}

// cgroupUsage reads the job's figures from the cgroup itself against the
// baselines taken at arm (a pooled sandbox or box): a few file reads
// instead of a round trip through containerd and the shim.
func (c *lifecycle) cgroupUsage(ctx context.Context, sb *sandbox) usage {
	var u usage
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		return u
	}
	var errs []error
	cpu, err := cg.CPUUsage()
	errs = append(errs, err)
	u.CPU = max(cpu-sb.cpuBase, 0)
	oom, err := cg.OOMKills()
	errs = append(errs, err)
	u.OOMKills = oom - min(oom, sb.oomBase)
	if sb.peakFile != nil {
		u.MemoryPeak, _ = host.ReadPeakFile(sb.peakFile)
	} else if cg.V2() {
		u.MemoryPeak, _ = host.ReadMemoryPeak(host.CgroupRoot, sb.cgroupsPath)
	} else {
		swap, err := cg.ReadInt("memory", "memory.memsw.max_usage_in_bytes")
		mem, err2 := cg.ReadInt("memory", "memory.max_usage_in_bytes")
		if err != nil {
			swap = 0
		}
		errs = append(errs, err2)
		u.MemoryPeak = max(mem, swap)
	}
	// The job's own figure: the peak less what the preloaded sandbox held.
	u.MemoryPeak = max(u.MemoryPeak-sb.baseline, 0)
	if err := errors.Join(errs...); err != nil {
		c.log.WarnContext(ctx, "box job figures", slog.String("container_id", sb.id), slog.Any("error", err))
	}
	return u
}

// onlySupervisor reports whether the sandbox holds no process but its
// supervisors, the processes it held when its zygote became ready (kiln-init,
// the launcher and the zygote it forked; boxProcs): a process that
// survived its job would share the next job's box.
func (b *boxClient) onlySupervisor(sb *sandbox) bool {
	pids, err := boxProcs(sb)
	if err != nil || !slices.Equal(pids, sb.box.supervisors) {
		b.log.WarnContext(context.Background(), "box retired: processes left after the job", slog.String("container_id", sb.id),
			slog.Int("processes", len(pids)), slog.Int("supervisors", len(sb.box.supervisors)), slog.Any("error", err))
		return false
	}
	return true
}

// boxProcs lists the processes in a box's cgroup, sorted.
func boxProcs(sb *sandbox) ([]int, error) {
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		return nil, err
	}
	pids, err := cg.Procs()
	slices.Sort(pids)
	return pids, err
}

// cpuMeter holds a job's CPU time over all its processes to its limit
// (RLIMIT_CPU bounds each process alone), read from the cgroup every
// boxCPUWatch. It is made once per job; a nil meter never ticks.
type cpuMeter struct {
	cg     host.CgroupDir
	base   time.Duration // the cgroup's count at arm
	budget time.Duration
	ticker *time.Ticker
}

// newCPUMeter returns the job's meter, or nil when it has no CPU limit or
// its cgroup cannot be read. Under gVisor the cgroup also counts the
// sentry's own work, so only runc sandboxes are metered.
func (c *lifecycle) newCPUMeter(sb *sandbox) *cpuMeter {
	if sb.cpuBudget <= 0 || sb.img == nil || sb.img.isolation != IsolationRunc {
		return nil
	}
	cg, err := host.NewCgroupDir(host.CgroupRoot, host.CgroupV2(), sb.cgroupsPath)
	if err != nil {
		c.log.Warn("job CPU meter", slog.String("container_id", sb.id), slog.Any("error", err))
		return nil
	}
	return &cpuMeter{cg: cg, base: sb.cpuBase, budget: sb.cpuBudget, ticker: time.NewTicker(boxCPUWatch)}
}

// tick is the channel to read the meter on (nil: never).
func (m *cpuMeter) tick() <-chan time.Time {
	if m == nil {
		return nil
	}
	return m.ticker.C
}

// over reports whether the job's processes together used more CPU than
// its limit.
func (m *cpuMeter) over() bool {
	if m == nil {
		return false
	}
	used, err := m.cg.CPUUsage()
	return err == nil && used-m.base > m.budget
}

func (m *cpuMeter) stop() {
	if m != nil {
		m.ticker.Stop()
	}
}
