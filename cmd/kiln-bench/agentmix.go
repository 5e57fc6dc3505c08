package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kilnrun/kiln/job"
	"github.com/kilnrun/kiln/sandbox/runtimes"
)

// The agent mix: programs of the kind agents write (statistics, pandas,
// charts, scipy, sympy, scikit-learn, networkx, openpyxl, seaborn, text),
// through the API on the default path (a box per tenant, its zygote
// preloading the image's list) against cold interpreters chrooted into the
// same image, at the same concurrency, in the same run.

// agentProgram is one program of the mix; lib names its per-library row.
type agentProgram struct{ lib, code string }

// Targets of the agent mix (issue: agent code at warm speed).
const (
	agentMixTarget  = 5.0 // box throughput / cold interpreters', the whole mix
	agentHeavyLimit = 0.2 // box p50 / cold p50 of each library-heavy program
)

// agentHeavy are the libraries whose programs must each reach agentHeavyLimit.
var agentHeavy = []string{"matplotlib", "seaborn", "scipy", "sklearn", "sympy"}

var agentPrograms = []agentProgram{
	{"stats", "import statistics as s\nxs = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]\nprint(s.mean(xs), s.median(xs), round(s.stdev(xs), 3))"},
	{"stats", "import math, random\nrandom.seed(7)\nxs = [random.gauss(10, 2) for _ in range(5000)]\nm = sum(xs) / len(xs)\nprint(round(m, 2), round(math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)), 2))"},
	{"pandas", "import pandas as pd\ndf = pd.DataFrame({'city': ['a', 'b', 'a', 'c', 'b'] * 200, 'sales': range(1000)})\nprint(df.groupby('city').sales.agg(['sum', 'mean']).round(1))"},
	{"pandas", "import io\nimport pandas as pd\ncsv = 'date,value\\n' + '\\n'.join(f'2024-01-{d:02d},{d * 3 % 7}' for d in range(1, 29))\ndf = pd.read_csv(io.StringIO(csv), parse_dates=['date'])\nprint(df.set_index('date').resample('W').sum())"},
	{"pandas", "import numpy as np, pandas as pd\ndf = pd.DataFrame(np.arange(60).reshape(20, 3), columns=list('xyz'))\nprint(df.describe().loc[['mean', 'std']].round(2))\nprint(df.corr().round(2))"},
	{"matplotlib", "import matplotlib.pyplot as plt\nplt.bar(['q1', 'q2', 'q3', 'q4'], [10, 14, 9, 17])\nplt.title('Revenue by quarter')\nplt.ylabel('k$')"},
	{"matplotlib", "import numpy as np\nimport matplotlib.pyplot as plt\nx = np.linspace(0, 10, 200)\nfig, ax = plt.subplots(2, 1)\nax[0].plot(x, np.sin(x))\nax[1].hist(np.cos(x), bins=20)\nplt.tight_layout()\nplt.show()"},
	{"matplotlib", "import io\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.scatter([1, 2, 3, 4], [4, 1, 3, 2], c=['r', 'g', 'b', 'k'])\nbuf = io.BytesIO()\nplt.savefig(buf, format='png')\nprint(len(buf.getvalue()) > 1000)"},
	{"seaborn", "import pandas as pd, seaborn as sns\ndf = pd.DataFrame({'g': ['a', 'b'] * 50, 'v': range(100)})\nax = sns.boxplot(data=df, x='g', y='v')\nprint(ax.get_xlabel())"},
	{"seaborn", "import numpy as np, seaborn as sns\nsns.heatmap(np.arange(16).reshape(4, 4), annot=True)\nprint('ok')"},
	{"scipy", "from scipy import stats\nt, p = stats.ttest_ind([5.1, 4.9, 5.3, 5.0, 5.2], [5.6, 5.8, 5.5, 5.9, 5.7])\nprint(round(t, 3), p < 0.05)"},
	{"scipy", "from scipy.optimize import minimize\nr = minimize(lambda v: (v[0] - 3) ** 2 + (v[1] + 1) ** 2, [0, 0])\nprint([round(x, 3) for x in r.x])"},
	{"scipy", "import numpy as np\nfrom scipy import integrate, interpolate\nprint(round(integrate.quad(np.exp, 0, 1)[0], 6))\nf = interpolate.interp1d([0, 1, 2], [0, 1, 4], kind='quadratic')\nprint(round(float(f(1.5)), 3))"},
	{"scipy", "import numpy as np\nfrom scipy import signal\nb, a = signal.butter(3, 0.1)\ny = signal.filtfilt(b, a, np.sin(np.linspace(0, 20, 500)))\nprint(round(float(y.max()), 2))"},
	{"sympy", "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 5*x + 6, x))\nprint(sp.integrate(sp.sin(x) * x, x))"},
	{"sympy", "from sympy import symbols, simplify, expand, factor, diff\na, b = symbols('a b')\ne = expand((a + b) ** 4)\nprint(factor(e), diff(e, a).subs({a: 1, b: 1}))"},
	{"sklearn", "from sklearn.linear_model import LinearRegression\nimport numpy as np\nX = np.arange(20).reshape(-1, 1)\nm = LinearRegression().fit(X, 3 * X.ravel() + 2)\nprint(round(m.coef_[0], 3), round(m.intercept_, 3))"},
	{"sklearn", "from sklearn.datasets import make_classification\nfrom sklearn.ensemble import RandomForestClassifier\nfrom sklearn.model_selection import train_test_split\nX, y = make_classification(n_samples=300, random_state=0)\na, b, c, d = train_test_split(X, y, random_state=0)\nprint(RandomForestClassifier(n_estimators=20, random_state=0).fit(a, c).score(b, d) > 0.7)"},
	{"sklearn", "from sklearn.cluster import KMeans\nfrom sklearn.preprocessing import StandardScaler\nimport numpy as np\nX = StandardScaler().fit_transform(np.r_[np.zeros((20, 2)), np.ones((20, 2)) * 5])\nprint(sorted(np.bincount(KMeans(2, n_init=3, random_state=0).fit_predict(X))))"},
	{"networkx", "import networkx as nx\ng = nx.Graph([(1, 2), (2, 3), (3, 4), (1, 4), (4, 5)])\nprint(nx.shortest_path(g, 1, 5), round(max(nx.pagerank(g).values()), 3))"},
	{"openpyxl", "import io\nfrom openpyxl import Workbook\nwb = Workbook()\nws = wb.active\nfor r in range(1, 51):\n    ws.append([r, r * r])\nws['C1'] = '=SUM(B1:B50)'\nbuf = io.BytesIO()\nwb.save(buf)\nprint(ws.max_row, len(buf.getvalue()) > 0)"},
	{"text", "import re, collections\ntext = 'the quick brown fox jumps over the lazy dog the end ' * 50\nprint(collections.Counter(re.findall(r'\\w+', text)).most_common(3))"},
	{"text", "import json, textwrap\nd = {'name': 'report', 'items': [{'id': i, 'ok': i % 2 == 0} for i in range(10)]}\ns = json.dumps(d, indent=2)\nprint(len(s), textwrap.shorten(s, 40))"},
	{"text", "from bs4 import BeautifulSoup\nhtml = '<ul>' + ''.join(f'<li class=\"i\">item {i}</li>' for i in range(20)) + '</ul>'\nprint(len(BeautifulSoup(html, 'html.parser').select('li.i')))"},
	{"text", "import yaml\ncfg = yaml.safe_load('a: 1\\nb: [x, y]\\nc: {d: true}')\nprint(cfg, yaml.safe_dump(cfg).count('\\n'))"},
	{"text", "from PIL import Image, ImageDraw\nim = Image.new('RGB', (64, 64), 'white')\nImageDraw.Draw(im).rectangle([8, 8, 40, 40], fill='red')\nprint(im.getpixel((10, 10)))"},
}

func init() {
	register(section{Name: "agentmix", Order: 30, Setup: agentMixSetup, Phase: agentMixPhase})
}

// agentMixBox is the box pipeline the mix runs on (agentMixSetup).
var agentMixBox *pipeline

func agentMixSetup(ctx context.Context, o *options) ([]row, func(), error) {
	if !o.Pipeline || o.AgentMixReps <= 0 {
		return nil, nil, nil
	}
	agentMixBox = &pipeline{name: "e2e box (default), agent mix"}
	// The pipeline's own print(1) row is the paths section's; only its
	// pipeline is used here.
	_, cleanup, err := agentMixBox.setup(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	return nil, cleanup, nil
}

// agentMixPhase prints the preload's import-time and memory table, then
// runs the mix through the API and chrooted, at concurrency 2.
func agentMixPhase(ctx context.Context, o *options) error {
	if agentMixBox == nil {
		return nil
	}
	rootfs, err := imageRootfs()
	if err != nil {
		return err
	}
	preload, err := pythonPreload()
	if err != nil {
		return err
	}
	if err := preloadTable(ctx, rootfs, preload); err != nil {
		return fmt.Errorf("preload table: %w", err)
	}
	const conc = 2
	// The same order on both sides: every program reps times, interleaved.
	var mix []int
	for range o.AgentMixReps {
		for i := range agentPrograms {
			mix = append(mix, i)
		}
	}
	bodies := make([][]byte, len(agentPrograms))
	for i, p := range agentPrograms {
		b, err := json.Marshal(job.Spec{Runtime: "python", Code: p.code, Cache: job.CacheOff()})
		if err != nil {
			return err
		}
		bodies[i] = b
	}
	viaAPI := func(ctx context.Context, i int) error {
		res, err := agentMixBox.submitWait(ctx, bodies[i])
		if err == nil && res.Status != job.StatusSucceeded {
			err = fmt.Errorf("agent program %d (%s): %s %v\n%s", i, agentPrograms[i].lib, res.Status, res.Error, res.Stderr)
		}
		return err
	}
	// The cold interpreter: the image's python3 chrooted as the paths
	// section's bare rows run it, with the image's matplotlib settings
	// (imagePython).
	cold := func(ctx context.Context, i int) error {
		var out []byte
		return runCmd(ctx, &out, "chroot", imagePython(rootfs, "-c", agentPrograms[i].code)...)
	}
	// Warm-up: the whole mix, once a pass, until a pass finds a box for
	// every job (a job that finds none of its class, lean or preloaded,
	// runs in a container of its own while one is made), and the page
	// cache for both sides.
	once := make([]int, len(agentPrograms))
	for i := range once {
		once[i] = i
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		misses := agentMixBox.sb.BoxStats().Misses
		if _, _, err := mixAt(ctx, conc, once, viaAPI); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		st := agentMixBox.sb.BoxStats()
		if st.Misses == misses && st.Idle >= conc {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the mix still missed boxes after 3 minutes of warm-up: %+v", st)
		}
	}
	for i := range agentPrograms {
		if err := cold(ctx, i); err != nil {
			return fmt.Errorf("cold %s program %d: %w", agentPrograms[i].lib, i, err)
		}
	}
	fmt.Printf("\nagent mix: %d programs × %d, through the API (box, default path) and in cold chrooted interpreters, concurrency %d, cache off\n",
		len(agentPrograms), o.AgentMixReps, conc)
	boxRate, boxLat, err := mixAt(ctx, conc, mix, viaAPI)
	if err != nil {
		return fmt.Errorf("box: %w", err)
	}
	coldRate, coldLat, err := mixAt(ctx, conc, mix, cold)
	if err != nil {
		return fmt.Errorf("cold: %w", err)
	}
	fmt.Printf("  %-34s %10s %10s %10s\n", "path", "jobs/s", "p50", "p99")
	all := func(m map[int][]time.Duration) (ds []time.Duration) {
		for _, v := range m {
			ds = append(ds, v...)
		}
		return ds
	}
	fmt.Printf("  %-34s %10.2f %10s %10s\n", "box (default), via the API", boxRate, ms(quantile(all(boxLat), 0.5)), ms(quantile(all(boxLat), 0.99)))
	fmt.Printf("  %-34s %10.2f %10s %10s\n", "cold chrooted interpreter", coldRate, ms(quantile(all(coldLat), 0.5)), ms(quantile(all(coldLat), 0.99)))
	r := boxRate / coldRate
	fmt.Printf("  %-52s %6.2f×  target ≥ %.1f×  %s\n", "mix throughput, box / cold", r, agentMixTarget, mark(r >= agentMixTarget))
	// Per library: the p50 of its programs' runs on each side.
	fmt.Printf("\n  %-12s %6s %10s %10s %8s\n", "library", "runs", "box p50", "cold p50", "ratio")
	var libs []string
	for _, p := range agentPrograms {
		if !slices.Contains(libs, p.lib) {
			libs = append(libs, p.lib)
		}
	}
	for _, lib := range libs {
		var b, c []time.Duration
		for i, p := range agentPrograms {
			if p.lib == lib {
				b, c = append(b, boxLat[i]...), append(c, coldLat[i]...)
			}
		}
		rb, rc := quantile(b, 0.5), quantile(c, 0.5)
		ratio := float64(rb) / float64(rc)
		verdict := ""
		if slices.Contains(agentHeavy, lib) {
			verdict = fmt.Sprintf("  target ≤ %.1f×  %s", agentHeavyLimit, mark(ratio <= agentHeavyLimit))
		}
		fmt.Printf("  %-12s %6d %10s %10s %7.2f×%s\n", lib, len(b), ms(rb), ms(rc), ratio, verdict)
	}
	// Each library-heavy program on its own (the target is per program),
	// next to two floors under any sandbox's p50: the program in a fork of
	// a preloaded interpreter (what a box's zygote does, without the jail
	// and the API), and its warm time.
	var heavy []int
	var codes []string
	for i, p := range agentPrograms {
		if slices.Contains(agentHeavy, p.lib) {
			heavy, codes = append(heavy, i), append(codes, p.code)
		}
	}
	forked, err := forkTimes(ctx, rootfs, preload, codes)
	if err != nil {
		return err
	}
	fmt.Printf("\n  %-12s %-30s %10s %10s %8s %10s %10s %10s %10s\n", "program", "", "box p50", "cold p50", "ratio", "fork", "fork/cold", "warm", "warm/cold")
	worst, worstAt := 0.0, -1
	for k, i := range heavy {
		p := agentPrograms[i]
		rb, rc := quantile(boxLat[i], 0.5), quantile(coldLat[i], 0.5)
		q := float64(rb) / float64(rc)
		if q > worst {
			worst, worstAt = q, i
		}
		w, err := warmTime(ctx, rootfs, p.code)
		if err != nil {
			return fmt.Errorf("%s program %d: %w", p.lib, i, err)
		}
		fmt.Printf("  %-12s %-30s %10s %10s %7.2f× %10s %9.2f× %10s %9.2f×  %s\n", fmt.Sprintf("%d %s", i, p.lib), programHead(p.code), ms(rb), ms(rc), q,
			ms(forked[k]), float64(forked[k])/float64(rc), ms(w), float64(w)/float64(rc), mark(q <= agentHeavyLimit))
	}
	fmt.Printf("  (fork: the program in a process forked for it from a chrooted interpreter that preloaded the image's list as a zygote does,\n" +
		"   run as the image's runner runs a job's and ended as a job ends, from fork to reaped, median of 10: no jail, no API, no queue;\n" +
		"   warm: the program run again in one chrooted interpreter that has run it twice, its figures rendered as a job's PNG outputs,\n" +
		"   median of 10, no fork: its own work, helped by what its earlier runs left in caches (sympy's results, OpenMP's threads)\n" +
		"   that a job forked from a zygote cannot have)\n")
	if worstAt >= 0 {
		fmt.Printf("  %-52s %6.2f×  target ≤ %.1f×  %s (program %d, %s)\n", "slowest library-heavy program, box p50 / cold p50",
			worst, agentHeavyLimit, mark(worst <= agentHeavyLimit), worstAt, agentPrograms[worstAt].lib)
	}
	return nil
}

// runAsJob defines run_as_job(code, null): code run as the image's runner
// runs a job's (its last expression and display() calls as outputs,
// plt.show() and the figures still open at the end rendered to PNG as
// outputs), the outputs written to the descriptor null. It returns the
// program's globals.
const runAsJob = `
import builtins, os, sys
sys.path.insert(0, "/usr/lib/kiln")
import runner

def run_as_job(code, null):
    body, last = runner.split_last_expression(code.encode(), "main.py")
    chan = runner.Channel(null)
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        fig_cls = sys.modules["matplotlib.figure"].Figure
        fig_cls.savefig = getattr(fig_cls.savefig, "__wrapped__", fig_cls.savefig)
        chan.patch_pyplot(plt)
    else:
        sys.meta_path.insert(0, chan)
    builtins.display = chan.display
    g = {"__name__": "__main__", "__builtins__": builtins}
    exec(body, g)
    if last is not None:
        chan.result(eval(last, g))
    chan.flush_figures(at_end=True)
    if chan in sys.meta_path:
        sys.meta_path.remove(chan)
    return g
`

// warmScript runs the program argv[1] argv[2] + 2 times in this
// interpreter (run_as_job, its stdout to /dev/null) and prints the median
// wall time of the runs after the first two, in ms.
const warmScript = runAsJob + `
import json, statistics, time
null = os.open(os.devnull, os.O_WRONLY)
out, sys.stdout = sys.stdout, open(os.devnull, "w")
times = []
for i in range(int(sys.argv[2]) + 2):
    t = time.perf_counter()
    run_as_job(sys.argv[1], null)
    t = time.perf_counter() - t
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
    if i >= 2:
        times.append(t * 1000)
print(json.dumps(statistics.median(times)), file=out)
`

// forkScript preloads the modules argv[1] (comma-separated) as a box's
// zygote does (preloader.preload, the collector frozen, huge pages), then
// runs each program of the JSON list argv[2] argv[3] + 2 times, each in a
// process forked for it that runs it as a job (reseeded, run_as_job, its
// stdout to /dev/null) and ends as a job ends (runner.finish), and prints
// the median wall time from fork to reaped of the runs after the first two,
// in ms, one for each program, as a JSON list.
const forkScript = runAsJob + `
import gc, json, statistics, time
import box, preloader
os.environ["OMP_NUM_THREADS"] = "1"  # as every sandbox of one CPU has it
preloader.preload(sys.argv[1])
gc.collect()
gc.freeze()
box.huge_pages()
null = os.open(os.devnull, os.O_WRONLY)
medians = []
for code in json.loads(sys.argv[2]):
    times = []
    for i in range(int(sys.argv[3]) + 2):
        t = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            try:
                os.dup2(null, 1)
                preloader.reseed()
                preloader.fresh({})
                runner.finish(0, run_as_job(code, null))
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        t = time.perf_counter() - t
        if status != 0:
            sys.exit("a program ended with status %d in its fork: %s" % (status, code))
        if i >= 2:
            times.append(t * 1000)
    medians.append(statistics.median(times))
print(json.dumps(medians))
`

// imagePython is chroot's arguments that run the image's python3 with
// args as the cold interpreter: matplotlib's Agg backend and the image's
// font cache (built with the image), so it pays imports alone.
func imagePython(rootfs string, args ...string) []string {
	return append([]string{rootfs, "env", "MPLBACKEND=Agg", "MPLCONFIGDIR=/usr/lib/kiln/matplotlib",
		"PYTHONHASHSEED=0", "python3", "-s", "-B"}, args...)
}

// inImage runs script with args in the image's python3 (imagePython) and
// decodes its JSON output into v.
func inImage(ctx context.Context, rootfs, script string, v any, args ...string) error {
	var out []byte
	if err := runCmd(ctx, &out, "chroot", imagePython(rootfs, append([]string{"-c", script}, args...)...)...); err != nil {
		return err
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("%q: %w", out, err)
	}
	return nil
}

// warmTime is code's warm time (warmScript) in the image.
func warmTime(ctx context.Context, rootfs, code string) (time.Duration, error) {
	var msf float64
	if err := inImage(ctx, rootfs, warmScript, &msf, code, "10"); err != nil {
		return 0, fmt.Errorf("warm time: %w", err)
	}
	return time.Duration(msf * float64(time.Millisecond)), nil
}

// forkTimes are the programs' times in forks of a preloaded interpreter
// (forkScript) in the image.
func forkTimes(ctx context.Context, rootfs string, preload []string, codes []string) ([]time.Duration, error) {
	list, err := json.Marshal(codes)
	if err != nil {
		return nil, err
	}
	var msf []float64
	if err := inImage(ctx, rootfs, forkScript, &msf, strings.Join(preload, ","), string(list), "10"); err != nil {
		return nil, fmt.Errorf("fork times: %w", err)
	}
	if len(msf) != len(codes) {
		return nil, fmt.Errorf("fork times: %d for %d programs", len(msf), len(codes))
	}
	ds := make([]time.Duration, len(msf))
	for i, m := range msf {
		ds[i] = time.Duration(m * float64(time.Millisecond))
	}
	return ds, nil
}

// mixAt runs the programs of mix (indexes into agentPrograms) from conc
// clients; it returns jobs per second and the latencies by program.
func mixAt(ctx context.Context, conc int, mix []int, run func(ctx context.Context, i int) error) (float64, map[int][]time.Duration, error) {
	lat := make([]time.Duration, len(mix))
	var next atomic.Int64
	start := time.Now()
	err := fanOut(ctx, conc, func(ctx context.Context) error {
		for {
			k := int(next.Add(1)) - 1
			if k >= len(mix) {
				return nil
			}
			t := time.Now()
			if err := run(ctx, mix[k]); err != nil {
				return err
			}
			lat[k] = time.Since(t)
		}
	})
	rate := float64(len(mix)) / time.Since(start).Seconds()
	by := map[int][]time.Duration{}
	for k, i := range mix {
		by[i] = append(by[i], lat[k])
	}
	return rate, by, err
}

// preloadScript imports the modules named in argv[1] in order, each on top
// of those before it, and prints one JSON line a module: the wall time of
// its import and the resident memory it added (the peak RSS grows only).
// It measures in a child it forks: a process's peak RSS survives exec, so
// the interpreter started by the benchmark's exec would begin at the
// benchmark's own peak and show no module's memory below it.
const preloadScript = `
import json, os, resource, sys, time
pid = os.fork()
if pid:
    os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
for name in sys.argv[1].split(","):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    __import__(name)
    ms = (time.perf_counter() - t) * 1000
    print(json.dumps({"module": name, "ms": ms, "kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss}))
`

// preloadTable prints what each module of the python image's preload list
// (deploy/images/python/runtime.json) costs a cold interpreter to import
// (the time a job saves) and the memory it adds to the zygote (what a box
// holds for it), the median of three chrooted runs.
func preloadTable(ctx context.Context, rootfs string, preload []string) error {
	type cost struct {
		Module string  `json:"module"`
		MS     float64 `json:"ms"`
		KiB    int64   `json:"kib"`
	}
	runs := make([][]cost, 3)
	for r := range runs {
		var out []byte
		if err := runCmd(ctx, &out, "chroot", imagePython(rootfs, "-c", preloadScript, strings.Join(preload, ","))...); err != nil {
			return err
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			var c cost
			if err := json.Unmarshal([]byte(l), &c); err != nil {
				return fmt.Errorf("%q: %w", l, err)
			}
			runs[r] = append(runs[r], c)
		}
	}
	fmt.Printf("\npython preload (deploy/images/python/runtime.json): each module's import on top of those above it, cold, median of %d chrooted runs\n", len(runs))
	fmt.Printf("  %-26s %12s %12s\n", "module", "import", "memory")
	var totalMS float64
	var totalKiB int64
	for i, c := range runs[0] {
		ts := []float64{c.MS}
		ks := []int64{c.KiB}
		for _, r := range runs[1:] {
			if i < len(r) {
				ts, ks = append(ts, r[i].MS), append(ks, r[i].KiB)
			}
		}
		slices.Sort(ts)
		slices.Sort(ks)
		t, k := ts[len(ts)/2], ks[len(ks)/2]
		totalMS += t
		totalKiB += k
		fmt.Printf("  %-26s %9.1f ms %8.1f MiB\n", c.Module, t, float64(k)/1024)
	}
	fmt.Printf("  %-26s %9.1f ms %8.1f MiB\n", "all", totalMS, float64(totalKiB)/1024)
	return nil
}

// pythonPreload is the python image's preload list
// (deploy/images/python/runtime.json).
func pythonPreload() ([]string, error) {
	raw, err := os.ReadFile("deploy/images/python/runtime.json")
	if err != nil {
		return nil, err
	}
	prof, err := runtimes.Parse(string(raw), runtimes.Rules{})
	if err != nil {
		return nil, err
	}
	return prof.Preload, nil
}

// programHead is a program's first line past its imports, shortened: what
// names it in the per-program rows.
func programHead(code string) string {
	lines := strings.Split(code, "\n")
	head := lines[0]
	for _, l := range lines {
		if !strings.HasPrefix(l, "import ") && !strings.HasPrefix(l, "from ") && !strings.HasPrefix(l, "matplotlib.use") {
			head = l
			break
		}
	}
	if r := []rune(head); len(r) > 30 {
		head = string(r[:29]) + "…"
	}
	return head
}
