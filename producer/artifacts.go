package producer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/kilnrun/kiln/cache"
	"github.com/kilnrun/kiln/internal/blob"
	"github.com/kilnrun/kiln/job"
)

// objectSeeker is an io.ReadSeeker over a stored object, for
// http.ServeContent: a seek forward skips, a seek back reopens the object.
// handleArtifact hands ServeContent its ranges sorted and merged, so a
// request reads the object at most once.
type objectSeeker struct {
	ctx  context.Context
	s    *blob.Store
	ref  job.ObjectRef
	r    io.ReadCloser // open at rpos, or nil
	rpos int64
	pos  int64
	err  error // the first read failure, for the log
}

func (o *objectSeeker) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += o.pos
	case io.SeekEnd:
		offset += o.ref.Size
	default:
		return 0, errors.New("artifact: bad whence")
	}
	if offset < 0 {
		return 0, errors.New("artifact: negative position")
	}
	o.pos = offset
	return offset, nil
}

func (o *objectSeeker) Read(p []byte) (int, error) {
	if o.pos >= o.ref.Size {
		return 0, io.EOF
	}
	if o.r != nil && o.rpos > o.pos {
		o.r.Close()
		o.r = nil
	}
	if o.r == nil {
		r, err := o.s.Open(o.ctx, o.ref)
		if err != nil {
			o.err = err
			return 0, err
		}
		o.r, o.rpos = r, 0
	}
	if o.rpos < o.pos {
		n, err := io.CopyN(io.Discard, o.r, o.pos-o.rpos)
		o.rpos += n
		if err != nil {
			o.err = err
			return 0, err
		}
	}
	n, err := o.r.Read(p)
	o.rpos += int64(n)
	o.pos += int64(n)
	if err != nil && err != io.EOF {
		o.err = err
	}
	return n, err
}

func (o *objectSeeker) Close() {
	if o.r != nil {
		o.r.Close()
	}
}

// handleArtifact answers GET /v1/jobs/{id}/artifacts/{name...}: one artifact
// of a finished job, to its owner only, with ETag = the content's SHA-256
// and Range support (at most MaxRanges ranges, see planRanges).
func (jr *jobRoutes) handleArtifact(w http.ResponseWriter, r *http.Request, caller string) {
	ctx := r.Context()
	id, name := r.PathValue("id"), r.PathValue("name")
	if !job.ValidID(id) {
		writeProblem(w, invalidID(id))
		return
	}
	rec, err := jr.store.GetJob(ctx, id)
	if errors.Is(err, cache.ErrNotFound) || (err == nil && rec.Message.TenantOrDefault() != caller) {
		// Another tenant's job is answered as if it did not exist.
		writeProblem(w, notFound(id))
		return
	}
	if err != nil {
		writeProblem(w, jr.problems.storeProblem(ctx, "get job", err))
		return
	}
	var art *job.Artifact
	if rec.Result != nil {
		for i := range rec.Result.Artifacts {
			if rec.Result.Artifacts[i].Name == name {
				art = &rec.Result.Artifacts[i]
				break
			}
		}
	}
	if art == nil {
		detail := fmt.Sprintf("job %s has no artifact %q", id, name)
		if !rec.Status.Terminal() {
			detail = fmt.Sprintf("job %s is %s: its artifacts are listed in its result once it has finished", id, rec.Status)
		}
		p := newProblem(http.StatusNotFound, job.ProblemNotFound, "Artifact not found", detail)
		p.Field = "name"
		writeProblem(w, p)
		return
	}
	etag := `"` + art.SHA256 + `"`
	if hdr := r.Header.Get("Range"); hdr != "" {
		if ir := r.Header.Get("If-Range"); ir == "" || ir == etag {
			// Sorted and merged, the ranges are served in one pass over the
			// object: no range makes the reader go back over what it read.
			rs, err := planRanges(hdr, art.Size)
			if err != nil {
				rangeRefused(w, hdr, name, art.Size, err)
				return
			}
			r = r.Clone(ctx)
			r.Header.Set("Range", rangeHeader(rs))
		}
	}
	ref := job.ObjectRef{Tenant: rec.Message.TenantOrDefault(), SHA256: art.SHA256, Size: art.Size}
	// Probe first, so a missing object is a clean 404 rather than a broken body.
	probe, err := jr.blobs.Open(ctx, ref)
	if errors.Is(err, blob.ErrNotFound) {
		writeProblem(w, newProblem(http.StatusNotFound, job.ProblemNotFound, "Artifact expired",
			fmt.Sprintf("the content of artifact %q of job %s is no longer stored", name, id)))
		return
	}
	if err != nil {
		writeProblem(w, jr.problems.storeProblem(ctx, "open artifact", fmt.Errorf("%w: %w", cache.ErrUnavailable, err)))
		return
	}
	rs := &objectSeeker{ctx: ctx, s: jr.blobs, ref: ref, r: probe}
	defer rs.Close()
	w.Header().Set("Content-Type", art.ContentType)
	w.Header().Set("ETag", etag)
	w.Header().Set("Cache-Control", "private, max-age=86400, immutable")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "sandbox")
	// The name is the job's choice: never let a browser render it inline as
	// part of this origin.
	w.Header().Set("Content-Disposition", "attachment")
	http.ServeContent(&rangeProblemWriter{ResponseWriter: w, rangeHdr: r.Header.Get("Range"), name: name, size: art.Size}, r, "", time.Time{}, rs)
	if rs.err != nil {
		jr.log.WarnContext(ctx, "serve artifact", slog.String("job_id", id), slog.String("name", name), slog.Any("error", rs.err))
	}
}
