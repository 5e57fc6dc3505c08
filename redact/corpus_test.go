package redact

import (
	"bufio"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// MaxFalsePositiveRate is the documented bound (docs/tenants.md, "Redaction") on
// the share of lines of the corpus below that are redacted although they
// hold no key.
const MaxFalsePositiveRate = 0.0001

// corpus returns lines that hold no key, by category: hashes, UUIDs,
// base64 data of random bytes, and ordinary text (Go's standard library
// sources, comments and code, and this repository's README and its pages
// under docs/).
func corpus(t testing.TB) map[string][]string {
	t.Helper()
	r := rand.New(rand.NewPCG(26, 1))
	c := map[string][]string{}
	buf := make([]byte, 512)
	for range 20000 {
		fill(r, buf[:64])
		s1, s256, m5 := sha1.Sum(buf[:64]), sha256.Sum256(buf[:64]), md5.Sum(buf[:64])
		c["hashes"] = append(c["hashes"], hex.EncodeToString(s1[:]), hex.EncodeToString(s256[:]),
			"sha256:"+hex.EncodeToString(s256[:]), strings.ToUpper(hex.EncodeToString(m5[:])),
			"commit "+hex.EncodeToString(s1[:])+" Merge branch 'main'")
	}
	for range 40000 {
		fill(r, buf[:16])
		buf[6] = buf[6]&0x0f | 0x40
		buf[8] = buf[8]&0x3f | 0x80
		h := hex.EncodeToString(buf[:16])
		c["uuids"] = append(c["uuids"], fmt.Sprintf("id=%s-%s-%s-%s-%s", h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
	}
	for range 20000 {
		n := 8 + r.IntN(500)
		fill(r, buf[:n])
		c["base64"] = append(c["base64"], base64.StdEncoding.EncodeToString(buf[:n]),
			base64.RawURLEncoding.EncodeToString(buf[:n]),
			"data:image/png;base64,"+base64.StdEncoding.EncodeToString(buf[:n]))
	}
	var files []string
	for _, dir := range []string{"net/http", "encoding/json", "fmt", "os", "strings", "text/template", "go/doc/comment", "crypto/x509"} {
		m, _ := filepath.Glob(filepath.Join(runtime.GOROOT(), "src", dir, "*.go"))
		files = append(files, m...)
	}
	docs, _ := filepath.Glob("../docs/*.md")
	decisions, _ := filepath.Glob("../docs/decisions/*.md")
	if len(docs) == 0 {
		t.Fatal("no pages under ../docs: the text corpus would lose the documentation")
	}
	files = append(files, "../README.md")
	files = append(files, docs...)
	files = append(files, decisions...)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue // test files hold sample keys: true positives
		}
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			c["text"] = append(c["text"], sc.Text())
		}
		fh.Close()
	}
	if len(c["text"]) < 50000 {
		t.Fatalf("text corpus has only %d lines", len(c["text"]))
	}
	return c
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func TestFalsePositiveRate(t *testing.T) {
	t.Parallel()
	d := mustNew(t, nil)
	var lines, hits int
	for cat, ls := range corpus(t) {
		n := 0
		for _, l := range ls {
			if out, c := d.String(l); c != nil {
				n++
				t.Logf("%s: %v in %.200q", cat, c, out)
			}
		}
		t.Logf("%s: %d of %d lines redacted (%.4f%%)", cat, n, len(ls), 100*float64(n)/float64(len(ls)))
		if r := float64(n) / float64(len(ls)); r > MaxFalsePositiveRate {
			t.Errorf("%s: false-positive rate %.5f%% over the documented %.3f%%", cat, 100*r, 100*MaxFalsePositiveRate)
		}
		lines += len(ls)
		hits += n
	}
	rate := float64(hits) / float64(lines)
	t.Logf("all: %d of %d lines redacted: %.5f%%", hits, lines, 100*rate)
	if rate > MaxFalsePositiveRate {
		t.Fatalf("false-positive rate %.5f%% over the documented %.3f%%", 100*rate, 100*MaxFalsePositiveRate)
	}
}
