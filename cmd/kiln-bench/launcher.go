package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/kilnrun/kiln/sandbox/initproto"
)

// The launcher section: what the Python launcher's output channel (display
// outputs, the exception; deploy/images/python/launch.py) adds to a job
// whose program makes no output. Both rows run the image's launcher in a
// chroot of the image's root filesystem, on a fresh /work each, with the
// same frame (each on an overlay of its own); one hands it an output channel (KILN_OUTPUT_FD), the
// other does not. Run it alone with `kiln-bench -only launcher`.

const (
	rowLauncherPlain   = "launcher, no output channel"
	rowLauncherChannel = "launcher, output channel"
	// launcherChannelTarget is the most the channel may add per job.
	launcherChannelTarget = time.Millisecond
)

func init() {
	register(section{
		Name:   "launcher",
		Order:  17,
		Setup:  launcherRows,
		Report: launcherReport,
	})
}

func launcherRows(_ context.Context, o *options) ([]row, func(), error) {
	rootfs, err := imageRootfs()
	if err != nil {
		return nil, nil, err
	}
	frame, err := initproto.Frame{Code: o.Code}.Encode()
	if err != nil {
		return nil, nil, fmt.Errorf("launcher frame: %w", err)
	}
	// Each run mounts a tmpfs on this directory in a mount namespace of its
	// own, and an overlay of the root filesystem there: the image has no
	// /work of its own, and the launcher creates main.py with O_EXCL.
	dir, err := os.MkdirTemp("", "kiln-bench-launcher-")
	if err != nil {
		return nil, nil, fmt.Errorf("launcher: %w", err)
	}
	cleanup := func() { _ = os.Remove(dir) }
	var want []byte
	runOne := func(channel bool) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			cmd := exec.CommandContext(ctx, "unshare", "-m", "--propagation", "private", "sh", "-c",
				`mount -t tmpfs -o size=64m tmpfs "$1" && mkdir "$1/u" "$1/w" "$1/m" && `+
					`mount -t overlay overlay -o "lowerdir=$0,upperdir=$1/u,workdir=$1/w" "$1/m" && mkdir -p "$1/m/work" && `+
					`exec chroot "$1/m" python3 -s -P -B /usr/lib/kiln/launch.py`, rootfs, dir)
			cmd.Stdin = bytes.NewReader(frame)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "PYTHONHASHSEED=0", "MPLBACKEND=Agg", "MPLCONFIGDIR=/tmp"}
			var outputs bytes.Buffer
			if channel {
				r, w, err := os.Pipe()
				if err != nil {
					return fmt.Errorf("output channel: %w", err)
				}
				defer r.Close()
				cmd.ExtraFiles = []*os.File{w}
				cmd.Env = append(cmd.Env, "KILN_OUTPUT_FD=3")
				done := make(chan struct{})
				go func() {
					_, _ = io.Copy(&outputs, r)
					close(done)
				}()
				defer func() { <-done }()
				defer w.Close()
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				return fmt.Errorf("launcher: %w: %s", err, stderr.String())
			}
			if want == nil {
				want = out
			} else if !bytes.Equal(out, want) {
				return fmt.Errorf("launcher printed %q, the first run %q", out, want)
			}
			return nil
		}
	}
	return []row{{rowLauncherPlain, runOne(false)}, {rowLauncherChannel, runOne(true)}}, cleanup, nil
}

// launcherReport prints what the channel added per job against its target.
func launcherReport(_ context.Context, o *options, medians map[string]time.Duration) {
	plain, ok1 := medians[rowLauncherPlain]
	channel, ok2 := medians[rowLauncherChannel]
	if !ok1 || !ok2 {
		return
	}
	added := channel - plain
	fmt.Printf("\nlauncher: the output channel adds %s per job of %q (target ≤ %s) %s\n",
		signedMS(added), o.Code, ms(launcherChannelTarget), mark(added <= launcherChannelTarget))
	fmt.Println("    medians of chrooted launcher runs on a fresh /work each, the same frame, with and without KILN_OUTPUT_FD")
}
