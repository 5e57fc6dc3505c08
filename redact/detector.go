package redact

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"slices"

	"github.com/kilnrun/kiln/job"
)

// Limits on what a tenant registers.
const (
	// MinSecretLen is the shortest secret a tenant may register: a shorter
	// one would redact ordinary words, and its fingerprint would give it away.
	MinSecretLen = 8
	// MaxSecretLen is the longest.
	MaxSecretLen = 1024
	// MaxPatterns and MaxSecrets bound what one tenant registers.
	MaxPatterns = 32
	MaxSecrets  = 256
)

// Counts is how many strings of each kind were replaced.
type Counts map[string]int

// Add adds o to c.
func (c Counts) Add(o Counts) {
	for k, v := range o {
		c[k] += v
	}
}

// Replacement is what a match of kind is replaced with.
func Replacement(kind string) string { return "[REDACTED:" + kind + "]" }

// Detector finds key-like strings. It is safe for concurrent use.
type Detector struct {
	mode    job.RedactMode
	trigger [256]bool // bytes some rule starts with
	// gluedTrigger: bytes some rule starts with that may follow a token
	// character.
	gluedTrigger [256]bool
	byFirst      [256][]*rule
	secrets      map[int]*secretSet // by length
	patterns     []namedRegexp
}

type namedRegexp struct {
	kind string
	re   *regexp.Regexp
}

// New returns the detector of policy p (nil: the default, RedactOn with
// nothing registered). An invalid pattern or fingerprint is an error.
func New(p *job.RedactPolicy) (*Detector, error) {
	if p == nil {
		p = &job.RedactPolicy{}
	}
	if !p.Mode.Valid() {
		return nil, fmt.Errorf("redact: unknown mode %q (off, on, strict)", p.Mode)
	}
	d := &Detector{mode: p.Mode}
	if d.mode == "" {
		d.mode = job.RedactOn
	}
	if d.mode == job.RedactOff {
		return d, nil
	}
	rules := builtins
	if d.mode == job.RedactStrict {
		rules = append(slices.Clip(rules), strictRules...)
	}
	for i := range rules {
		r := &rules[i]
		for _, c := range []byte(r.first) {
			d.byFirst[c] = append(d.byFirst[c], r)
			d.trigger[c] = true
			d.gluedTrigger[c] = d.gluedTrigger[c] || r.glued
		}
	}
	for _, s := range p.Secrets {
		if s.Len < MinSecretLen || s.Len > MaxSecretLen {
			return nil, fmt.Errorf("redact: secret length %d out of [%d, %d]", s.Len, MinSecretLen, MaxSecretLen)
		}
		if d.secrets == nil {
			d.secrets = map[int]*secretSet{}
		}
		if d.secrets[s.Len] == nil {
			d.secrets[s.Len] = &secretSet{prints: map[uint64][]string{}}
		}
		d.secrets[s.Len].add(s)
	}
	for _, pt := range p.Patterns {
		re, err := CompilePattern(pt.Regexp)
		if err != nil {
			return nil, fmt.Errorf("redact: pattern %s: %w", pt.Name, err)
		}
		d.patterns = append(d.patterns, namedRegexp{kind: KindPatternPrefix + pt.Name, re: re})
	}
	return d, nil
}

// CompilePattern compiles a tenant's pattern, refusing one that matches the
// empty string (it would redact nothing but cost a scan per byte).
func CompilePattern(expr string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("compile: %w", err)
	}
	if re.MatchString("") {
		return nil, fmt.Errorf("%q matches the empty string", expr)
	}
	return re, nil
}

// Off reports whether the detector redacts nothing.
func (d *Detector) Off() bool { return d == nil || d.mode == job.RedactOff }

// Fingerprint is the fingerprint of a secret a tenant registers.
func Fingerprint(secret string) (job.SecretPrint, error) {
	if len(secret) < MinSecretLen || len(secret) > MaxSecretLen {
		return job.SecretPrint{}, fmt.Errorf("a secret must be %d to %d bytes long, not %d", MinSecretLen, MaxSecretLen, len(secret))
	}
	sum := sha256.Sum256([]byte(secret))
	return job.SecretPrint{Len: len(secret), Roll: rollHash([]byte(secret)), SHA256: hex.EncodeToString(sum[:])}, nil
}

// span is one match: bytes [start, end) are replaced.
type span struct {
	start, end int
	kind       string
	// anchor is where the match begins to be recognised (the keyword of a
	// header whose value is replaced): a stream holds back from there.
	anchor int
}

// find returns the non-overlapping matches in b, by start. prev is the
// byte before b (0 at the start of the output).
func (d *Detector) find(b []byte, prev byte) []span {
	if d.Off() {
		return nil
	}
	var out []span
	trigger := &d.trigger
	for i := 0; i < len(b); i++ {
		if !trigger[b[i]] {
			continue
		}
		rs := d.byFirst[b[i]]
		p := prev
		if i > 0 {
			p = b[i-1]
		}
		glued := tokenChar[p]
		if glued && !d.gluedTrigger[b[i]] {
			continue
		}
		for _, r := range rs {
			if glued && !r.glued {
				continue
			}
			if s, e, ok := r.match(b, i); ok {
				out = append(out, span{s, e, r.kind, i})
				i = e - 1
				break
			}
		}
	}
	extra := d.findSecrets(b)
	for _, nr := range d.patterns {
		for _, m := range nr.re.FindAllIndex(b, -1) {
			extra = append(extra, span{m[0], m[1], nr.kind, m[0]})
		}
	}
	if len(extra) == 0 {
		return out
	}
	return merge(append(out, extra...))
}

// merge sorts spans and drops those overlapping an earlier one (at one
// start, the longer is kept).
func merge(s []span) []span {
	slices.SortFunc(s, func(a, b span) int {
		if a.start != b.start {
			return a.start - b.start
		}
		return b.end - a.end
	})
	out := s[:0]
	end := -1
	for _, x := range s {
		if x.start < end || x.end <= x.start {
			continue
		}
		out = append(out, x)
		end = x.end
	}
	return out
}

// replace writes b with spans replaced to dst and counts them.
func replace(dst, b []byte, spans []span, c Counts) []byte {
	last := 0
	for _, s := range spans {
		dst = append(dst, b[last:s.start]...)
		dst = append(dst, Replacement(s.kind)...)
		c[s.kind]++
		last = s.end
	}
	return append(dst, b[last:]...)
}

// Redact returns b with every match replaced, and what was replaced. When
// nothing matched it returns b itself and a nil Counts.
func (d *Detector) Redact(b []byte) ([]byte, Counts) {
	spans := d.find(b, 0)
	if len(spans) == 0 {
		return b, nil
	}
	c := Counts{}
	return replace(make([]byte, 0, len(b)+16*len(spans)), b, spans, c), c
}

// String is Redact for a string.
func (d *Detector) String(s string) (string, Counts) {
	out, c := d.Redact([]byte(s))
	if c == nil {
		return s, nil
	}
	return string(out), c
}
