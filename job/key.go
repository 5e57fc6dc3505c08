package job

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sort"
)

// KeyVersion changes whenever the encoding below changes, so old entries stop matching.
const KeyVersion = "kiln-key-v1"

// Key is the result-cache key of a job: hex SHA-256 over a canonical,
// length-prefixed encoding of everything that can change the outcome:
// runtime, image digest, code, stdin, args, files (name + content hash), env
// (sorted), resolved limits and network policy. The spec's limits must already
// be resolved (Policy.Resolve) so a default and its explicit value share a key.
func Key(s Spec, imageDigest string) string { return keyWithScope("", s, imageDigest) }

// scopedKeyVersion starts the encoding of a key with a scope, so a scoped
// encoding can never equal an unscoped one.
const scopedKeyVersion = "kiln-key-v1-scoped"

func keyWithScope(scope string, s Spec, imageDigest string) string {
	h := sha256.New()
	w := keyWriter{h}
	if scope == "" {
		w.str(KeyVersion)
	} else {
		w.str(scopedKeyVersion)
		w.str(scope)
	}
	w.str(s.Runtime)
	w.str(imageDigest)
	w.str(s.Code)
	w.str(s.Stdin)
	w.num(int64(len(s.Args)))
	for _, a := range s.Args {
		w.str(a)
	}
	files := make([]File, len(s.Files))
	copy(files, s.Files)
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	w.num(int64(len(files)))
	for _, f := range files {
		b, _ := f.Bytes() // validated earlier; an undecodable file hashes its raw text
		if b == nil {
			b = []byte(f.Content)
		}
		sum := sha256.Sum256(b)
		w.str(f.Name)
		w.str(string(sum[:]))
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	w.num(int64(len(keys)))
	for _, k := range keys {
		w.str(k)
		w.str(s.Env[k])
	}
	l := s.Limits
	for _, v := range []int64{l.TimeoutMS, l.MemoryMB, l.CPUMS, l.Pids, l.OutputBytes, l.DiskMB} {
		w.num(v)
	}
	if s.Network.Empty() {
		w.str(NetworkNone)
	} else {
		// The producer stores the allowlist in canonical form (lower case,
		// sorted, de-duplicated), so equal allowlists share a key.
		w.str(networkAllow)
		w.num(int64(len(s.Network.Allow)))
		for _, a := range s.Network.Allow {
			w.str(a)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// NetworkNone is the network policy of a job without an allowlist: loopback
// only. A job with one is keyed by networkAllow and its rules, so keys of
// jobs without network are what they were before allowlists existed.
const NetworkNone = "none"

const networkAllow = "allow"

// CodeSHA256 is the hex SHA-256 of the code alone (a trace attribute; code is never traced).
func CodeSHA256(code string) string {
	sum := sha256.Sum256([]byte(code))
	return hex.EncodeToString(sum[:])
}

type keyWriter struct{ h hash.Hash }

func (w keyWriter) num(v int64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(v))
	w.h.Write(b[:])
}

func (w keyWriter) str(s string) {
	w.num(int64(len(s)))
	w.h.Write([]byte(s))
}
