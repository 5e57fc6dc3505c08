package sandbox

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kilnrun/kiln/internal/testkit"
	"github.com/kilnrun/kiln/job"
)

// runStored runs spec on rt with an artifact store in memory (the tenant is
// the suite's: a box serves one tenant) and fails on a platform error.
func runStored(t *testing.T, rt *Containerd, spec job.Spec) (job.Result, *testkit.MemStore) {
	t.Helper()
	st := &testkit.MemStore{}
	base := Request{Tenant: "suite", Store: st.Put}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := rt.Run(ctx, asRun(base, job.NewID(), spec))
	if err != nil {
		t.Fatalf("Run: %v (result %+v)", err, res)
	}
	return res, st
}

// requirePNG fails unless b64 is a PNG image.
func requirePNG(t *testing.T, b64 string) {
	t.Helper()
	if size := decodePNG(t, b64).Bounds().Size(); size.X == 0 || size.Y == 0 {
		t.Fatalf("image/png is %v: empty", size)
	}
}

// A DataFrame on the last line, two display() calls, a figure never saved
// or shown, and a line printed in the channel's own encoding: the outputs
// are the two displays, the DataFrame and the figure, in that order, and
// the printed line is only stdout.
func TestDisplayOutputs(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	forged := `{"type":"display_data","data":{"text/plain":"forged"}}`
	res, _ := runStored(t, rt, py(`import pandas as pd
import matplotlib.pyplot as plt
display("first")
display({"n": 2})
print('`+forged+`')
plt.plot([1, 4, 9])
df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
df
`))
	requireSucceeded(t, res, forged+"\n")
	if len(res.Outputs) != 4 || res.OutputsTruncated {
		t.Fatalf("want 4 outputs; got %d (truncated %v): %+v", len(res.Outputs), res.OutputsTruncated, res.Outputs)
	}
	first, second, frame, fig := res.Outputs[0], res.Outputs[1], res.Outputs[2], res.Outputs[3]
	if first.Type != job.OutputDisplay || first.Text(job.MIMEText) != "'first'" {
		t.Errorf("first display: %+v", first)
	}
	if second.Type != job.OutputDisplay || second.Text(job.MIMEText) != "{'n': 2}" || string(second.Data[job.MIMEJSON]) != `{"n":2}` {
		t.Errorf("second display: %+v", second)
	}
	if frame.Type != job.OutputResult || !strings.Contains(frame.Text(job.MIMEText), "a  b") ||
		!strings.Contains(frame.Text(job.MIMEHTML), "<table") {
		t.Errorf("the DataFrame: %+v", frame)
	}
	if fig.Type != job.OutputDisplay || !fig.Has(job.MIMEPNG) || !strings.Contains(fig.Text(job.MIMEText), "Figure") {
		t.Fatalf("the figure: %+v", fig)
	}
	requirePNG(t, fig.Text(job.MIMEPNG))
	for _, o := range res.Outputs {
		if strings.Contains(o.Text(job.MIMEText), "forged") {
			t.Errorf("printing made an output: %+v", o)
		}
	}
}

// plt.show() returns the figures shown at that point (and only once); a
// value of None or an assignment on the last line shows nothing; a PIL
// image is an image/png.
func TestDisplayShowAndRules(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res, _ := runStored(t, rt, py(`import matplotlib.pyplot as plt
from PIL import Image
plt.plot([1, 2])
plt.show()
display(Image.new("RGB", (3, 2)))
print("after")
x = 5
`))
	requireSucceeded(t, res, "after\n")
	if len(res.Outputs) != 2 {
		t.Fatalf("want the shown figure and the image; got %+v", res.Outputs)
	}
	requirePNG(t, res.Outputs[0].Text(job.MIMEPNG))
	requirePNG(t, res.Outputs[1].Text(job.MIMEPNG))
	res, _ = runStored(t, rt, py("x = 1\nprint(x)\nNone\n"))
	requireSucceeded(t, res, "1\n")
	if len(res.Outputs) != 0 {
		t.Errorf("None on the last line made outputs: %+v", res.Outputs)
	}
	res, _ = runStored(t, rt, py("6 * 7;\n"))
	if len(res.Outputs) != 0 {
		t.Errorf("a last expression ended by ';' made outputs: %+v", res.Outputs)
	}
	// A figure the program saved comes back as its file, not twice.
	res, _ = runStored(t, rt, py(`import os
import matplotlib.pyplot as plt
plt.figure(figsize=(2, 2))
plt.plot([1, 2])
plt.savefig(os.environ["KILN_OUTPUT_DIR"] + "/saved.png")
plt.figure()
plt.plot([2, 1]);
`))
	if len(res.Outputs) != 1 || !strings.Contains(res.Outputs[0].Text(job.MIMEText), "640x480") || len(res.Artifacts) != 1 {
		t.Errorf("a saved figure and an open one: %d outputs, artifacts %+v", len(res.Outputs), res.Artifacts)
	}
}

// A figure's PNG output is the image savefig(bbox_inches="tight") writes
// (what Jupyter's inline backend shows): the same size and the same
// pixels, aligned, whether the figure is drawn once and cropped (a chart
// inside its canvas; constrained layout, whose padding reaches past the
// canvas) or drawn by savefig itself (a legend outside the figure, which
// only savefig's enlarged canvas holds). The program prints savefig's own
// PNG of each figure before showing them.
func TestDisplayFigureIsTheTightSavefig(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res, _ := runStored(t, rt, py(`import base64, io
import matplotlib.pyplot as plt
f1 = plt.figure()
plt.bar(["q1", "q2", "q3"], [3, 5, 4])
plt.title("Revenue by quarter")
plt.ylabel("k$")
f2 = plt.figure(layout="constrained")
f2.subplots(1, 2)[1].set_title("padding past the canvas")
f3 = plt.figure()
plt.plot([1, 2])
plt.legend(["outside the figure"], bbox_to_anchor=(1.4, 0.5))
for f in (f1, f2, f3):
    buf = io.BytesIO()
    f.savefig(buf, format="png", bbox_inches="tight")
    print(base64.b64encode(buf.getvalue()).decode())
plt.show()
`))
	if res.Status != job.StatusSucceeded || len(res.Outputs) != 3 {
		t.Fatalf("%s, %d outputs; want 3 figures\n%s", res.Status, len(res.Outputs), res.Stderr)
	}
	want := strings.Fields(res.Stdout)
	if len(want) != 3 {
		t.Fatalf("stdout has %d images; want savefig's 3", len(want))
	}
	for i, o := range res.Outputs {
		got, wantImg := decodePNG(t, o.Text(job.MIMEPNG)), decodePNG(t, want[i])
		if got.Bounds() != wantImg.Bounds() {
			t.Errorf("figure %d: %v; savefig's tight PNG is %v", i+1, got.Bounds().Size(), wantImg.Bounds().Size())
			continue
		}
		// Aligned: no shift by a pixel matches savefig's image better.
		aligned := pixelDiff(got, wantImg, 0, 0)
		for dy := -1; dy <= 1; dy++ {
			for dx := -1; dx <= 1; dx++ {
				if d := pixelDiff(got, wantImg, dx, dy); (dx != 0 || dy != 0) && d <= aligned {
					t.Errorf("figure %d: shifted by (%d, %d) it differs from savefig's by %.3f, aligned by %.3f", i+1, dx, dy, d, aligned)
				}
			}
		}
		if aligned > 2 {
			t.Errorf("figure %d differs from savefig's by %.3f a channel on average; want within a pixel's offset", i+1, aligned)
		}
	}
	// The wide figure is wider than its canvas (640 pixels): the legend is in it.
	if w := decodePNG(t, res.Outputs[2].Text(job.MIMEPNG)).Bounds().Dx(); w <= 640 {
		t.Errorf("the figure with a legend outside is %d pixels wide; want the legend in it", w)
	}
}

// decodePNG decodes a base64 PNG.
func decodePNG(t *testing.T, b64 string) image.Image {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("a PNG is not base64: %v", err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("a PNG does not decode: %v", err)
	}
	return img
}

// pixelDiff is the mean absolute difference a channel (0-255) between a
// and b shifted by (dx, dy), over the pixels both cover.
func pixelDiff(a, b image.Image, dx, dy int) float64 {
	r := a.Bounds().Intersect(b.Bounds().Add(image.Pt(dx, dy)))
	var sum, n float64
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			p := color.NRGBAModel.Convert(a.At(x, y)).(color.NRGBA)
			q := color.NRGBAModel.Convert(b.At(x-dx, y-dy)).(color.NRGBA)
			for _, d := range [4][2]uint8{{p.R, q.R}, {p.G, q.G}, {p.B, q.B}, {p.A, q.A}} {
				sum += math.Abs(float64(d[0]) - float64(d[1]))
				n++
			}
		}
	}
	return sum / max(n, 1)
}

// An uncaught exception and a syntax error come back structured.
func TestDisplayExceptions(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res, _ := runStored(t, rt, py("def f(n):\n    return 1 / n\nf(0)\n"))
	exc := res.Error.Exception
	if res.Status != job.StatusFailed || exc == nil {
		t.Fatalf("want a failure with an exception; got %s %+v", res.Status, res.Error)
	}
	if exc.Type != "ZeroDivisionError" || exc.Message != "division by zero" || exc.Line != 2 || exc.SourceLine != "return 1 / n" {
		t.Errorf("exception: %+v", exc)
	}
	if len(exc.Frames) != 2 || exc.Frames[0].Line != 3 || exc.Frames[1].Function != "f" || exc.Frames[0].File != "/work/main.py" {
		t.Errorf("frames (the program's only): %+v", exc.Frames)
	}
	res, _ = runStored(t, rt, py("x = 1\ny = 2\nprint(x / 0)\n"))
	if e := res.Error; e == nil || e.Exception == nil || e.Exception.Type != "ZeroDivisionError" || e.Exception.Line != 3 {
		t.Errorf("1/0 on line 3: %+v", e)
	}
	res, _ = runStored(t, rt, py("x = 1\nprint((x,\ny = 2\n"))
	exc = res.Error.Exception
	if res.Error.Category != job.CategorySyntaxError || exc == nil || exc.Type != "SyntaxError" || exc.Line != 2 || exc.Column != 7 {
		t.Fatalf("unclosed bracket: %+v %+v", res.Error, exc)
	}
	if exc.SourceLine != "print((x," || len(exc.Frames) != 0 {
		t.Errorf("syntax error: %+v", exc)
	}
}

// Many outputs are cut at job.MaxOutputs and the cut is reported; a value
// over the inline bound is stored as an artifact and referenced; text/plain
// stays inline (its start).
func TestDisplayHostileMany(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	res, st := runStored(t, rt, py(`for i in range(200):
    display(i)
display("x" * 3_000_000)
`))
	requireSucceeded(t, res, "")
	if len(res.Outputs) != job.MaxOutputs || !res.OutputsTruncated || res.OutputsDropped != 201-job.MaxOutputs+0 {
		t.Fatalf("want %d outputs and %d dropped; got %d, dropped %d, truncated %v", job.MaxOutputs, 201-job.MaxOutputs, len(res.Outputs), res.OutputsDropped, res.OutputsTruncated)
	}
	for i, o := range res.Outputs {
		if o.Text(job.MIMEText) != fmt.Sprint(i) {
			t.Fatalf("output %d out of order: %+v", i, o)
		}
	}
	res, st = runStored(t, rt, py(`display("y" * 3_000_000)`))
	if len(res.Outputs) != 1 {
		t.Fatalf("want one output; got %+v", res.Outputs)
	}
	o := res.Outputs[0]
	name := o.Artifacts[job.MIMEText]
	if name == "" || len(o.Text(job.MIMEText)) > 8192 || !strings.HasPrefix(o.Text(job.MIMEText), "'yyy") {
		t.Fatalf("the long value: artifacts %v, inline %d bytes", o.Artifacts, len(o.Text(job.MIMEText)))
	}
	var stored []byte
	for _, a := range res.Artifacts {
		if a.Name == name {
			stored = st.Get(a.SHA256)
		}
	}
	if len(stored) != 1_048_576 { // the launcher's own bound on a text value (MAX_TEXT)
		t.Errorf("the stored value is %d bytes", len(stored))
	}
}

// An output made before the job's time ran out is kept; a figure bomb
// (many huge figures) ends in time with its outputs bounded.
func TestDisplayHostileTimeoutAndFigures(t *testing.T) {
	t.Parallel()
	rt := setup(t)
	spec := py("display('before')\nimport time\ntime.sleep(60)\n")
	spec.Limits.TimeoutMS = 2000
	res, _ := runStored(t, rt, spec)
	if res.Status != job.StatusTimedOut || len(res.Outputs) != 1 || res.Outputs[0].Text(job.MIMEText) != "'before'" {
		t.Fatalf("want timed out with the output made before; got %s %+v", res.Status, res.Outputs)
	}
	spec = py(`import matplotlib.pyplot as plt
for i in range(300):
    plt.figure(figsize=(400, 400))
`)
	spec.Limits.TimeoutMS = 60_000
	started := time.Now()
	res, _ = runStored(t, rt, spec)
	if res.Status != job.StatusSucceeded || len(res.Outputs) != job.MaxOutputs || res.OutputsDropped != 300-job.MaxOutputs {
		t.Fatalf("figure bomb: %s, %d outputs, %d dropped (%+v)", res.Status, len(res.Outputs), res.OutputsDropped, res.Error)
	}
	images := 0
	for _, o := range res.Outputs {
		if o.Has(job.MIMEPNG) {
			images++
		}
	}
	if images == 0 || images > 8 {
		t.Errorf("figure bomb rendered %d images (budget: 32 Mpx, 4 Mpx each)", images)
	}
	t.Logf("figure bomb: %s, %d images", time.Since(started), images)
}

// Node: a thrown TypeError and a syntax error come back structured; a
// line printed in the channel's encoding is only stdout.
func TestDisplayNodeExceptions(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "node")
	res, _ := runStored(t, rt, js(`console.log('{"exception":{"type":"Forged","message":"x"}}');
function check(v) {
  throw new TypeError("not a number: " + v);
}
check("a");
`))
	exc := res.Error.Exception
	if res.Status != job.StatusFailed || exc == nil || exc.Type != "TypeError" || exc.Message != "not a number: a" || exc.Line != 3 ||
		exc.SourceLine != `throw new TypeError("not a number: " + v);` {
		t.Fatalf("TypeError: %s %+v %+v", res.Status, res.Error, exc)
	}
	if len(exc.Frames) != 2 || exc.Frames[0].Line != 5 || exc.Frames[1].Function != "check" {
		t.Errorf("frames: %+v", exc.Frames)
	}
	res, _ = runStored(t, rt, js("let x = 1;\nlet y = (2;\n"))
	exc = res.Error.Exception
	if res.Error.Category != job.CategorySyntaxError || exc == nil || exc.Type != "SyntaxError" || exc.Line != 2 || exc.Column != 11 {
		t.Fatalf("syntax error: %+v %+v", res.Error, exc)
	}
}
