package redact

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// benchOutput is 1 MiB of typical program output: log lines, numbers,
// hashes, base64 and a key every 64 KiB.
func benchOutput() []byte {
	r := rand.New(rand.NewPCG(7, 7))
	var b strings.Builder
	buf := make([]byte, 48)
	for i := 0; b.Len() < 1<<20; i++ {
		fill(r, buf)
		switch i % 4 {
		case 0:
			fmt.Fprintf(&b, "2026-11-24T20:%02d:%02d INFO processed batch %d of %d rows in %.3fs (authorised by scheduler)\n", i%60, i%60, i, r.IntN(1e6), r.Float64())
		case 1:
			fmt.Fprintf(&b, "sha256=%x file=/tmp/data/part-%05d.parquet size=%d\n", buf[:32], i, r.IntN(1e9))
		case 2:
			fmt.Fprintf(&b, "{\"id\": %d, \"payload\": \"%x\", \"ok\": true, \"score\": %.5f}\n", i, buf, r.Float64())
		default:
			fmt.Fprintf(&b, "Traceback (most recent call last): File \"/work/main.py\", line %d, in <module> ValueError: bad value %q\n", i, buf[:8])
		}
		if i%700 == 0 {
			fmt.Fprintf(&b, "OPENAI_API_KEY=sk-proj-%s\n", mixedKey(r, urlSafe, 64))
		}
	}
	return []byte(b.String())
}

func BenchmarkRedact(b *testing.B) {
	out := benchOutput()
	for _, mode := range []job.RedactMode{job.RedactOn, job.RedactStrict} {
		b.Run(string(mode), func(b *testing.B) {
			fp, _ := Fingerprint("tenant-registered-secret")
			d := mustNew(b, &job.RedactPolicy{Mode: mode, Secrets: []job.SecretPrint{fp}})
			b.SetBytes(int64(len(out)))
			for b.Loop() {
				d.Redact(out)
			}
		})
	}
}

func BenchmarkStream(b *testing.B) {
	out := benchOutput()
	d := mustNew(b, nil)
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		s := d.Stream()
		for i := 0; i < len(out); i += 4096 {
			s.Write(out[i:min(len(out), i+4096)])
		}
		s.Flush()
	}
}
