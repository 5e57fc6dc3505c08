package producer

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/kilnrun/kiln/job"
)

// Bounds on the Range header of an artifact download.
const (
	// MaxRanges is the most ranges one request is served, after overlapping
	// or nearly adjacent ranges are merged; a request asking for more is
	// answered 416. Every range costs a pass of the object store's reader
	// up to it, so a small number keeps a request's cost near one download.
	MaxRanges = 8
	// maxRangeSpecs bounds the specs parsed from one Range header at all,
	// before merging: a header of thousands of ranges is refused unread.
	maxRangeSpecs = 100
	// rangeMergeGap merges two ranges separated by fewer bytes than this:
	// a multipart part's headers cost about as much (RFC 9110 §14.2 lets a
	// server coalesce such ranges).
	rangeMergeGap = 80
)

// errRangeTooMany and errRangeUnsatisfiable are the two refusals of
// planRanges besides a syntax error.
var (
	errRangeTooMany       = errors.New("too many ranges")
	errRangeUnsatisfiable = errors.New("no range selects bytes of the artifact")
)

// byteRange is one range to serve: first and last byte, inclusive.
type byteRange struct{ first, last int64 }

// planRanges parses a Range header for content of size bytes and returns
// the ranges to serve: sorted by position, overlapping and nearly adjacent
// ones merged, unsatisfiable ones dropped (RFC 9110 §14.1.2), so the object
// is read once, front to back, however the client ordered them. It refuses
// a header of more than maxRangeSpecs specs or more than MaxRanges ranges
// once merged, one that selects no byte (bytes=-0, a first byte past the
// end) and one that does not parse.
func planRanges(hdr string, size int64) ([]byteRange, error) {
	spec, ok := strings.CutPrefix(hdr, "bytes=")
	if !ok {
		return nil, fmt.Errorf("unit is not bytes")
	}
	parts := strings.Split(spec, ",")
	if len(parts) > maxRangeSpecs {
		return nil, fmt.Errorf("%w: %d specs", errRangeTooMany, len(parts))
	}
	var rs []byteRange
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			continue // empty list elements are allowed (RFC 9110 §5.6.1)
		}
		a, b, ok := strings.Cut(p, "-")
		if !ok {
			return nil, fmt.Errorf("range %q has no '-'", p)
		}
		a, b = strings.TrimSpace(a), strings.TrimSpace(b)
		if a == "" {
			// A suffix: the last n bytes. bytes=-0 selects nothing.
			n, err := parseRangeInt(b)
			if err != nil {
				return nil, err
			}
			if n == 0 || size == 0 {
				continue
			}
			rs = append(rs, byteRange{max(size-n, 0), size - 1})
			continue
		}
		first, err := parseRangeInt(a)
		if err != nil {
			return nil, err
		}
		last := size - 1
		if b != "" {
			if last, err = parseRangeInt(b); err != nil {
				return nil, err
			}
			if last < first {
				return nil, fmt.Errorf("range %q ends before it starts", p)
			}
		}
		if first >= size {
			continue
		}
		rs = append(rs, byteRange{first, min(last, size-1)})
	}
	if len(rs) == 0 {
		return nil, errRangeUnsatisfiable
	}
	slices.SortFunc(rs, func(x, y byteRange) int {
		if x.first != y.first {
			if x.first < y.first {
				return -1
			}
			return 1
		}
		return 0
	})
	merged := rs[:1]
	for _, r := range rs[1:] {
		cur := &merged[len(merged)-1]
		if r.first <= cur.last+rangeMergeGap {
			cur.last = max(cur.last, r.last)
			continue
		}
		merged = append(merged, r)
	}
	if len(merged) > MaxRanges {
		return nil, fmt.Errorf("%w: %d ranges once merged", errRangeTooMany, len(merged))
	}
	return merged, nil
}

func parseRangeInt(s string) (int64, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a byte position", s)
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a byte position", s)
	}
	return n, nil
}

// rangeHeader writes rs back as a Range header, for http.ServeContent.
func rangeHeader(rs []byteRange) string {
	var b strings.Builder
	b.WriteString("bytes=")
	for i, r := range rs {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d-%d", r.first, r.last)
	}
	return b.String()
}

// rangeRefused is the 416 answer to a Range planRanges refused.
func rangeRefused(w http.ResponseWriter, hdr, name string, size int64, err error) {
	detail := fmt.Sprintf("Range %q does not select bytes of artifact %q, which has %d bytes: ask for bytes=FIRST-LAST within 0-%d, or send no Range",
		hdr, name, size, max(size-1, 0))
	if errors.Is(err, errRangeTooMany) {
		detail = fmt.Sprintf("Range %q asks for more than %d ranges (after merging overlapping ones; at most %d specs are read): ask for fewer ranges, or send no Range for the whole artifact",
			truncateHeader(hdr), MaxRanges, maxRangeSpecs)
	}
	w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
	p := newProblem(http.StatusRequestedRangeNotSatisfiable, job.ProblemInvalidParameter, "Range not satisfiable", detail)
	p.Field = "Range"
	writeProblem(w, p)
}

// truncateHeader keeps a problem's detail short whatever the header's size.
func truncateHeader(h string) string {
	if len(h) <= 64 {
		return h
	}
	return h[:64] + "…"
}
