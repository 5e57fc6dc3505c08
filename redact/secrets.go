package redact

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"

	"github.com/kilnrun/kiln/job"
)

// rollBase is the base of the polynomial rolling hash (mod 2^64) that
// finds candidate windows for registered secrets (Rabin–Karp); SHA-256
// confirms each candidate.
const rollBase = 1099511628211

func rollHash(b []byte) uint64 {
	var h uint64
	for _, c := range b {
		h = h*rollBase + uint64(c)
	}
	return h
}

// secretSet is the registered secrets of one length: a 65,536-bit filter
// on the rolling hash keeps the map lookup off the path of almost every
// window.
type secretSet struct {
	filter [1024]uint64
	prints map[uint64][]string // rolling hash → SHA-256s
}

func (s *secretSet) add(p job.SecretPrint) {
	s.filter[p.Roll>>6&1023] |= 1 << (p.Roll & 63)
	s.prints[p.Roll] = append(s.prints[p.Roll], p.SHA256)
}

// findSecrets returns the windows of b whose bytes are a registered secret.
func (d *Detector) findSecrets(b []byte) []span {
	var out []span
	for n, set := range d.secrets {
		if len(b) < n {
			continue
		}
		var pow uint64 = 1 // rollBase^(n-1)
		for range n - 1 {
			pow *= rollBase
		}
		h := rollHash(b[:n])
		for i := 0; ; i++ {
			if set.filter[h>>6&1023]&(1<<(h&63)) == 0 {
				// not a secret
			} else if sums, ok := set.prints[h]; ok {
				sum := sha256.Sum256(b[i : i+n])
				if slices.Contains(sums, hex.EncodeToString(sum[:])) {
					out = append(out, span{i, i + n, KindSecret, i})
				}
			}
			if i+n >= len(b) {
				break
			}
			h = (h-uint64(b[i])*pow)*rollBase + uint64(b[i+n])
		}
	}
	return out
}

// maxSecret is the longest registered secret.
func (d *Detector) maxSecret() int {
	m := 0
	for n := range d.secrets {
		m = max(m, n)
	}
	return m
}
