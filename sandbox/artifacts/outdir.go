package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"github.com/kilnrun/kiln/job"
)

// Bounds on the walk of an output dir, apart from the caps on what is kept:
// a job can create many more entries than it may return, and the walk must
// end quickly whatever it left.
const (
	maxOutputEntries = 100_000
	maxOutputDepth   = 32
	sniffLen         = 512
)

// Store stores one object, content-addressed: ref names its SHA-256 and
// size, r gives its bytes (the run's sandboxapi.Request.Store).
type Store func(ctx context.Context, ref job.ObjectRef, r io.Reader) error

// outputCollector walks one output dir after its sandbox's last process is
// gone. It never follows a symbolic link, opens only what the directory says
// is a regular file, opens it with O_NOFOLLOW|O_NONBLOCK (a FIFO swapped in
// cannot block it), and checks with fstat that what it opened is a regular
// file before reading a byte. All of it happens inside an os.Root on the
// sandbox's own tmpfs, so no name can reach outside it; a hard link on a
// tmpfs can only point at another file of the same tmpfs.
type outputCollector struct {
	root    *os.Root
	caps    job.ArtifactCaps
	store   Store
	entries int
	total   int64
	res     *job.Result
}

// CollectOutputDir lists the regular files of the output dir in work (the
// host path of a job's work dir; job.OutputDir inside it) into
// res.Artifacts, in name order, and gives each to store; what it does not
// keep (links, special files, names, what the caps refuse, what store
// fails on) is counted and listed in res.ArtifactsSkipped. Call it once
// every process that could write to work is gone; store must not be nil.
// Its error is the work dir's or ctx's: a missing output dir is no error.
func CollectOutputDir(ctx context.Context, work string, caps job.ArtifactCaps, store Store, res *job.Result) error {
	root, err := os.OpenRoot(work)
	if err != nil {
		return fmt.Errorf("open work dir: %w", err)
	}
	defer root.Close()
	out := path.Base(job.OutputDir)
	fi, err := root.Lstat(out)
	if err != nil || !fi.IsDir() {
		// The program removed it or put something else there: nothing to return.
		return nil
	}
	c := &outputCollector{root: root, caps: caps, store: store, res: res}
	return c.walk(ctx, out, "", 0)
}

func (c *outputCollector) skip(name string, size int64, reason string) {
	c.res.ArtifactsSkippedCount++
	if len(c.res.ArtifactsSkipped) < job.MaxSkippedListed {
		c.res.ArtifactsSkipped = append(c.res.ArtifactsSkipped, job.SkippedArtifact{Name: name, Size: size, Reason: reason})
	}
}

// walk visits dir (a path in the root) whose entries are named rel/... in the result.
func (c *outputCollector) walk(ctx context.Context, dir, rel string, depth int) error {
	d, err := c.root.OpenFile(dir, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY, 0)
	if err != nil {
		c.skip(rel, 0, job.SkipError)
		return nil
	}
	defer d.Close()
	// The tmpfs's inode cap bounds how many entries there can be.
	ents, err := d.ReadDir(-1)
	if err != nil {
		c.skip(rel, 0, job.SkipError)
		return nil
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		name := path.Join(rel, e.Name())
		c.entries++
		if c.entries > maxOutputEntries {
			c.skip(name, 0, job.SkipCount)
			continue
		}
		switch {
		case e.Type().IsDir():
			if depth+1 >= maxOutputDepth {
				c.skip(name+"/", 0, job.SkipName)
				continue
			}
			if err := c.walk(ctx, path.Join(dir, e.Name()), name, depth+1); err != nil {
				return err
			}
		case !e.Type().IsRegular():
			c.skip(name, 0, job.SkipNotRegular)
		default:
			c.file(ctx, path.Join(dir, e.Name()), name)
		}
	}
	return nil
}

// file keeps one regular file if the caps allow.
func (c *outputCollector) file(ctx context.Context, p, name string) {
	if !utf8.ValidString(name) || len(name) > job.MaxFileNameLen {
		c.skip(name, 0, job.SkipName)
		return
	}
	f, err := c.root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		c.skip(name, 0, job.SkipNotRegular)
		return
	}
	defer f.Close()
	fi, err := f.Stat() // fstat of what was opened, not of the name
	if err != nil || !fi.Mode().IsRegular() {
		c.skip(name, 0, job.SkipNotRegular)
		return
	}
	size := fi.Size()
	switch {
	case len(c.res.Artifacts) >= c.caps.MaxFiles:
		c.skip(name, size, job.SkipCount)
		return
	case size > c.caps.MaxFileBytes:
		c.skip(name, size, job.SkipTooLarge)
		return
	case c.total+size > c.caps.MaxTotalBytes:
		c.skip(name, size, job.SkipTotal)
		return
	}
	h := sha256.New()
	var head bytes.Buffer
	n, err := io.Copy(io.MultiWriter(h, &limitedBuffer{&head, sniffLen}), io.LimitReader(f, size))
	if err != nil || n != size {
		c.skip(name, size, job.SkipError)
		return
	}
	ref := job.ObjectRef{SHA256: hex.EncodeToString(h.Sum(nil)), Size: size}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		c.skip(name, size, job.SkipError)
		return
	}
	if err := c.store(ctx, ref, io.LimitReader(f, size)); err != nil {
		c.skip(name, size, job.SkipError)
		return
	}
	c.total += size
	c.res.Artifacts = append(c.res.Artifacts, job.Artifact{
		Name: name, Size: size, SHA256: ref.SHA256, ContentType: http.DetectContentType(head.Bytes()),
	})
}

// limitedBuffer keeps the first n bytes written to it.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
