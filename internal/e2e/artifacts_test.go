package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/producer"
	"github.com/kilnrun/kiln/producer/client"
)

// getArtifact downloads one artifact through the API.
func getArtifact(t *testing.T, base, id, name string, hdr http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/jobs/"+id+"/artifacts/"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

const cleanCSV = `
import os
import pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = os.environ["KILN_OUTPUT_DIR"]
df = pd.read_csv("data/sales.csv")
df = df.dropna()
df.to_csv(out + "/clean.csv", index=False)
ax = df.plot(x="month", y="units")
os.makedirs(out + "/plots")
plt.savefig(out + "/plots/units.png")
print(len(df))
`

const salesCSV = "month,units\n1,10\n2,\n3,30\n4,25\n"

// A pandas job reads an uploaded CSV and writes a PNG plot and a cleaned CSV
// to its output dir: both are listed with sniffed types, download with their
// hashes as ETags (whole and by range), the PNG decodes, another tenant gets
// 404, and a resubmission is a cache hit whose artifacts download under the
// new id.
func TestArtifactsPandasEndToEnd(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-art", 1)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	spec := py("%s", cleanCSV)
	spec.Files = []job.File{{Name: "data/sales.csv", Content: salesCSV}}
	sub, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded || strings.TrimSpace(v.Stdout) != "3" {
		t.Fatalf("job %s: %s stdout %q stderr %q", sub.ID, v.Status, v.Stdout, v.Stderr)
	}
	arts := map[string]job.Artifact{}
	for _, a := range v.Artifacts {
		arts[a.Name] = a
	}
	csvA, pngA := arts["clean.csv"], arts["plots/units.png"]
	if len(v.Artifacts) != 2 || !strings.HasPrefix(csvA.ContentType, "text/plain") || pngA.ContentType != "image/png" {
		t.Fatalf("artifacts %+v; want clean.csv (text/plain) and plots/units.png (image/png)", v.Artifacts)
	}
	resp, body := getArtifact(t, e.apiURL, sub.ID, "clean.csv", nil)
	if resp.StatusCode != 200 || sha256Hex(body) != csvA.SHA256 || string(body) != "month,units\n1,10.0\n3,30.0\n4,25.0\n" {
		t.Errorf("clean.csv: %d %q (sha256 %s, listed %s)", resp.StatusCode, body, sha256Hex(body), csvA.SHA256)
	}
	resp, body = getArtifact(t, e.apiURL, sub.ID, "plots/units.png", nil)
	if resp.StatusCode != 200 || sha256Hex(body) != pngA.SHA256 || int64(len(body)) != pngA.Size {
		t.Fatalf("units.png: %d, %d bytes, sha256 %s; listed %+v", resp.StatusCode, len(body), sha256Hex(body), pngA)
	}
	if got := resp.Header.Get("ETag"); got != `"`+pngA.SHA256+`"` {
		t.Errorf("ETag %q; want the quoted sha256", got)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "image/png" {
		t.Errorf("Content-Type %q", ct)
	}
	img, err := png.Decode(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("PNG does not decode: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("PNG is %v", b)
	}
	full := body
	resp, body = getArtifact(t, e.apiURL, sub.ID, "plots/units.png", http.Header{"Range": {"bytes=100-1099"}})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(body, full[100:1100]) ||
		resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 100-1099/%d", len(full)) {
		t.Errorf("range: %d %q, %d bytes", resp.StatusCode, resp.Header.Get("Content-Range"), len(body))
	}
	resp, _ = getArtifact(t, e.apiURL, sub.ID, "plots/units.png", http.Header{"If-None-Match": {`"` + pngA.SHA256 + `"`}})
	if resp.StatusCode != http.StatusNotModified {
		t.Errorf("If-None-Match with the hash: %d; want 304", resp.StatusCode)
	}
	if resp, _ = getArtifact(t, e.apiURL, sub.ID, "nope.txt", nil); resp.StatusCode != 404 {
		t.Errorf("unknown artifact: %d; want 404", resp.StatusCode)
	}

	// Another tenant (an API with keys, on the same store) does not see it.
	other, err := producer.New(ctx, producer.Config{Store: e.store, NATS: e.nc, Queue: testQueue,
		Policy: job.DefaultPolicy(), APIKeys: map[string]string{"bob-key": "bob"}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	hs := serveAPI(t, other.Handler())
	defer hs.Close()
	if resp, _ = getArtifact(t, hs.URL, sub.ID, "clean.csv", http.Header{"Authorization": {"Bearer bob-key"}}); resp.StatusCode != 404 {
		t.Errorf("another tenant's download: %d; want 404", resp.StatusCode)
	}

	// Resubmitted: a cache hit listing the same artifacts, downloadable under the new id.
	runs := e.runs.total.Load()
	hit, err := e.api.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if !hit.CacheHit || hit.ID == sub.ID || e.runs.total.Load() != runs {
		t.Fatalf("resubmission: cache hit %v, id %s, runs %d→%d", hit.CacheHit, hit.ID, runs, e.runs.total.Load())
	}
	if fmt.Sprint(hit.Artifacts) != fmt.Sprint(v.Artifacts) {
		t.Errorf("cache hit artifacts %+v; want %+v", hit.Artifacts, v.Artifacts)
	}
	for _, a := range v.Artifacts {
		resp, body := getArtifact(t, e.apiURL, hit.ID, a.Name, nil)
		if resp.StatusCode != 200 || sha256Hex(body) != a.SHA256 {
			t.Errorf("cache hit %s/%s: %d, sha256 %s; want %s", hit.ID, a.Name, resp.StatusCode, sha256Hex(body), a.SHA256)
		}
	}
	// The other tenant's identical job is not answered with content it cannot read: it runs.
	bob, err := client.New(hs.URL, client.WithAPIKey("bob-key"))
	if err != nil {
		t.Fatal(err)
	}
	bsub, err := bob.Submit(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if bsub.CacheHit {
		t.Fatalf("another tenant's identical job was a cache hit on content stored for the first")
	}
	bv, err := bob.Wait(ctx, bsub.ID)
	if err != nil || bv.Status != job.StatusSucceeded {
		t.Fatalf("bob's job: %v %s %s", err, bv.Status, bv.Stderr)
	}
	if resp, body = getArtifact(t, hs.URL, bsub.ID, "clean.csv", http.Header{"Authorization": {"Bearer bob-key"}}); resp.StatusCode != 200 || sha256Hex(body) != csvA.SHA256 {
		t.Errorf("bob's own download: %d", resp.StatusCode)
	}
}

// Links to host files, /proc/self/environ and /etc/hostname, a FIFO and a
// hard link planted in the output dir leak nothing through the pipeline and
// do not hang it; 10,000 files and one file past the size cap are capped and
// reported.
func TestArtifactsHostileEndToEnd(t *testing.T) {
	e := setup(t)
	e.startWorker(t, "w-art-hostile", 1)
	canary := filepath.Join(t.TempDir(), "canary")
	secret := "host-canary-" + job.NewID()
	if err := os.WriteFile(canary, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	sub, err := e.api.Submit(ctx, py(`
import os
out = os.environ["KILN_OUTPUT_DIR"]
os.symlink(%q, out + "/canary")
os.symlink("/proc/self/environ", out + "/environ")
os.symlink("/etc/hostname", out + "/hostname")
os.mkfifo(out + "/fifo")
os.link("/work/main.py", out + "/hardlink")
open(out + "/big", "wb").write(b"x" * (%d + 1))
os.makedirs(out + "/many")
for i in range(10000):
    open(out + "/many/%%05d" %% i, "w").write(str(i))
print("planted")
`, canary, job.DefaultArtifactCaps.MaxFileBytes))
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.api.Wait(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != job.StatusSucceeded {
		t.Fatalf("job: %s %q", v.Status, v.Stderr)
	}
	if d := time.Since(start); d > 90*time.Second {
		t.Errorf("took %v", d)
	}
	reasons := map[string]string{}
	for _, s := range v.ArtifactsSkipped {
		reasons[s.Name] = s.Reason
	}
	for _, name := range []string{"canary", "environ", "hostname", "fifo"} {
		if reasons[name] != job.SkipNotRegular {
			t.Errorf("%s: skipped as %q; want %s", name, reasons[name], job.SkipNotRegular)
		}
	}
	if reasons["big"] != job.SkipTooLarge {
		t.Errorf("big: skipped as %q; want %s", reasons["big"], job.SkipTooLarge)
	}
	if len(v.Artifacts) != job.DefaultArtifactCaps.MaxFiles || v.ArtifactsSkippedCount < 10000-job.DefaultArtifactCaps.MaxFiles {
		t.Errorf("%d kept, %d skipped; want %d kept and the rest skipped", len(v.Artifacts), v.ArtifactsSkippedCount, job.DefaultArtifactCaps.MaxFiles)
	}
	for _, a := range v.Artifacts {
		resp, body := getArtifact(t, e.apiURL, sub.ID, a.Name, nil)
		if resp.StatusCode != 200 || sha256Hex(body) != a.SHA256 {
			t.Errorf("%s: %d", a.Name, resp.StatusCode)
		}
		for _, leak := range []string{secret, "PATH=", host} {
			if leak != "" && bytes.Contains(body, []byte(leak)) {
				t.Errorf("artifact %s holds %q", a.Name, leak)
			}
		}
		if a.Name == "hardlink" && !bytes.Contains(body, []byte("planted")) {
			t.Errorf("hard link is not the job's own main.py: %q", body)
		}
	}
}
