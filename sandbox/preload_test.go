package sandbox

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// setupPreloaded is a runtime whose python jobs all run in boxes whose
// zygote preloads the image profile's list (deploy/images/python
// runtime.json): boxConfig without its empty preload override.
func setupPreloaded(t *testing.T) *Containerd {
	t.Helper()
	if !testBox() {
		t.Skip("the preload of a box's zygote")
	}
	cfg := boxConfig(setupConfig(t))
	cfg.Pool.Preload = nil
	return startRuntime(t, cfg)
}

// preloadedList is the python image's preload list, as the worker read it
// from the image.
func preloadedList(t *testing.T, rt *Containerd) []string {
	t.Helper()
	img, err := rt.images.resolve(namespacesCtx(t, rt), "python")
	if err != nil {
		t.Fatalf("the python image: %v", err)
	}
	if len(img.profile.Preload) < 10 {
		t.Fatalf("the python image preloads %v; want the agent list (deploy/images/python/runtime.json)", img.profile.Preload)
	}
	return img.profile.Preload
}

// Every module of the list is loaded before the job's code runs, and what
// the preload did is invisible to the job: it holds no descriptor but its
// standard streams and the output channel, one thread, and a job that
// uses the module gets the module's usual answer. One subtest a module;
// each runs the module's own check twice, so two jobs of one box see the
// same fresh state.
func TestPreloadEveryModule(t *testing.T) {
	t.Parallel()
	rt := setupPreloaded(t)
	list := preloadedList(t, rt)
	use := map[string]string{
		"numpy":                           "import numpy as np; assert np.arange(4).sum() == 6",
		"pandas":                          "import pandas as pd; assert pd.DataFrame({'a': [1, 2]}).a.sum() == 3",
		"matplotlib":                      "import matplotlib; assert matplotlib.get_backend().lower() == 'agg', matplotlib.get_backend()",
		"matplotlib.pyplot":               "import matplotlib.pyplot as plt; assert plt.get_fignums() == []",
		"matplotlib.backends.backend_agg": "import io, matplotlib.pyplot as plt; from matplotlib.backends.backend_agg import FigureCanvasAgg; fig = plt.figure(); b = io.BytesIO(); fig.savefig(b, format='png'); assert isinstance(fig.canvas, FigureCanvasAgg) and b.getvalue()[:4] == b'\\x89PNG'",
		"scipy":                           "import scipy; assert scipy.__version__",
		"scipy.stats":                     "from scipy import stats; assert abs(stats.norm.cdf(0) - 0.5) < 1e-12",
		"scipy.optimize":                  "from scipy import optimize; assert abs(optimize.brentq(lambda x: x*x - 2, 0, 2) - 2**0.5) < 1e-9",
		"scipy.integrate":                 "from scipy import integrate; assert abs(integrate.quad(lambda x: x, 0, 1)[0] - 0.5) < 1e-12",
		"scipy.interpolate":               "from scipy import interpolate; assert float(interpolate.interp1d([0, 1], [0, 2])(0.5)) == 1.0",
		"scipy.linalg":                    "from scipy import linalg; assert linalg.det([[2, 0], [0, 2]]) == 4",
		"scipy.signal":                    "from scipy import signal; assert len(signal.windows.hann(8)) == 8",
		"scipy.sparse":                    "from scipy import sparse; assert sparse.eye(3).nnz == 3",
		"scipy.spatial":                   "from scipy import spatial; assert spatial.distance.euclidean([0, 0], [3, 4]) == 5",
		"scipy.special":                   "from scipy import special; assert special.comb(5, 2) == 10",
		"scipy.fft":                       "from scipy import fft; assert len(fft.fft([1, 2, 3, 4])) == 4",
		"scipy.cluster.hierarchy":         "from scipy.cluster import hierarchy; assert hierarchy.linkage([[0], [1], [5]]).shape == (2, 4)",
		"sklearn":                         "import sklearn; assert sklearn.__version__",
		"sklearn.linear_model":            "from sklearn.linear_model import LinearRegression; assert abs(LinearRegression().fit([[0], [1]], [0, 2]).coef_[0] - 2) < 1e-9",
		"sklearn.ensemble":                "from sklearn.ensemble import RandomForestClassifier; RandomForestClassifier(n_estimators=3).fit([[0], [1]], [0, 1])",
		"sklearn.model_selection":         "from sklearn.model_selection import train_test_split; assert len(train_test_split(list(range(10)))[0]) == 7",
		"sklearn.preprocessing":           "from sklearn.preprocessing import StandardScaler; assert StandardScaler().fit_transform([[1], [3]]).tolist() == [[-1.0], [1.0]]",
		"sklearn.cluster":                 "from sklearn.cluster import KMeans; KMeans(n_clusters=2, n_init=1).fit([[0], [1], [10]])",
		"sklearn.metrics":                 "from sklearn.metrics import accuracy_score; assert accuracy_score([1, 0], [1, 1]) == 0.5",
		"sklearn.tree":                    "from sklearn.tree import DecisionTreeClassifier; DecisionTreeClassifier().fit([[0], [1]], [0, 1])",
		"sklearn.decomposition":           "from sklearn.decomposition import PCA; assert PCA(1).fit_transform([[0, 0], [1, 1], [2, 2]]).shape == (3, 1)",
		"sklearn.datasets":                "from sklearn.datasets import make_blobs; assert make_blobs(n_samples=10)[0].shape == (10, 2)",
		"sklearn.pipeline":                "from sklearn.pipeline import make_pipeline; from sklearn.preprocessing import StandardScaler; make_pipeline(StandardScaler())",
		"sklearn.neighbors":               "from sklearn.neighbors import KNeighborsClassifier; KNeighborsClassifier(1).fit([[0], [1]], [0, 1])",
		"sklearn.svm":                     "from sklearn.svm import SVC; SVC().fit([[0], [1]], [0, 1])",
		"sympy":                           "import sympy as sp; x = sp.Symbol('x'); assert sp.integrate(2*x, x) == x**2",
		"sympy.tensor.tensor":             "from sympy.tensor.tensor import TensorIndexType, tensor_indices; L = TensorIndexType('L'); i, j = tensor_indices('i j', L); assert str(L.metric(i, j)) == 'metric(i, j)'",
		"sympy.sets.setexpr":              "from sympy import Interval; from sympy.sets.setexpr import SetExpr; assert (SetExpr(Interval(0, 1)) + 1).set == Interval(1, 2)",
		"sympy.assumptions.wrapper":       "from sympy import Symbol; from sympy.assumptions.wrapper import is_extended_nonnegative; assert is_extended_nonnegative(Symbol('p', positive=True))",
		"sympy.integrals.manualintegrate": "from sympy import Symbol, exp; from sympy.integrals.manualintegrate import manualintegrate; x = Symbol('x'); assert manualintegrate(x * exp(x), x).equals((x - 1) * exp(x))",
		"sympy.integrals.heurisch":        "from sympy import Symbol, sin, cos; from sympy.integrals.heurisch import heurisch; x = Symbol('x'); assert heurisch(sin(x) * cos(x), x).diff(x).equals(sin(x) * cos(x))",
		"sympy.integrals.risch":           "from sympy import Symbol, exp; from sympy.integrals.risch import risch_integrate; x = Symbol('x'); assert risch_integrate(exp(x), x) == exp(x)",
		"seaborn":                         "import seaborn as sns; assert sns.color_palette()[0]",
		"networkx":                        "import networkx as nx; assert nx.shortest_path_length(nx.path_graph(4), 0, 3) == 3",
		"openpyxl":                        "import openpyxl; wb = openpyxl.Workbook(); wb.active['A1'] = 1; wb.save('/tmp/a.xlsx')",
		"PIL.Image":                       "from PIL import Image; assert Image.new('RGB', (2, 2)).size == (2, 2)",
		"PIL.PngImagePlugin":              "import io; from PIL import Image; b = io.BytesIO(); Image.new('RGB', (4, 4)).save(b, 'PNG'); assert Image.open(io.BytesIO(b.getvalue())).format == 'PNG'",
		"PIL.JpegImagePlugin":             "import io; from PIL import Image; b = io.BytesIO(); Image.new('RGB', (4, 4)).save(b, 'JPEG'); assert Image.open(io.BytesIO(b.getvalue())).format == 'JPEG'",
		"PIL.GifImagePlugin":              "import io; from PIL import Image; b = io.BytesIO(); Image.new('P', (4, 4)).save(b, 'GIF'); assert Image.open(io.BytesIO(b.getvalue())).format == 'GIF'",
		"PIL.BmpImagePlugin":              "import io; from PIL import Image; b = io.BytesIO(); Image.new('RGB', (4, 4)).save(b, 'BMP'); assert Image.open(io.BytesIO(b.getvalue())).format == 'BMP'",
		"PIL.PpmImagePlugin":              "import io; from PIL import Image; b = io.BytesIO(); Image.new('RGB', (4, 4)).save(b, 'PPM'); assert Image.open(io.BytesIO(b.getvalue())).format == 'PPM'",
		"bs4":                             "from bs4 import BeautifulSoup; assert BeautifulSoup('<p>hi</p>', 'html.parser').p.text == 'hi'",
		"yaml":                            "import yaml; assert yaml.safe_load('a: 1') == {'a': 1}",
	}
	// What the job holds before its code uses the module: its descriptors
	// beyond its standard streams (the output channel alone, a pipe) and
	// its threads; then the module's check.
	const probe = `
import os, sys, threading
print(%q in sys.modules)
extra = []
for f in os.listdir('/proc/self/fd'):
    if int(f) > 2:
        try:
            t = os.readlink('/proc/self/fd/' + f)
        except OSError:
            continue  # the listing's own, closed by now
        extra.append('pipe' if t.startswith('pipe:') else t)
print(sorted(extra))
print(threading.active_count(), len(os.listdir('/proc/self/task')))
%s
`
	for _, mod := range list {
		code, ok := use[mod]
		if !ok {
			t.Errorf("preloaded module %s has no check here", mod)
			continue
		}
		t.Run(mod, func(t *testing.T) {
			var seen []string
			for range 2 {
				src := strings.Replace(strings.Replace(probe, "%q", pyQuote(mod), 1), "%s", code, 1)
				res, _ := runStored(t, rt, py(src))
				if res.Status != job.StatusSucceeded {
					t.Fatalf("%s: %s %+v\n%s", mod, res.Status, res.Error, res.Stderr)
				}
				l := strings.Split(strings.TrimSpace(res.Stdout), "\n")
				if len(l) != 3 || l[0] != "True" {
					t.Fatalf("%s: stdout %q; want it preloaded (True first)", mod, res.Stdout)
				}
				if l[1] != "['pipe']" {
					t.Errorf("%s: the job holds descriptors %s beyond its standard streams; want its output channel alone", mod, l[1])
				}
				if l[2] != "1 1" {
					t.Errorf("%s: threads (threading, /proc) %s; want the job's one", mod, l[2])
				}
				seen = append(seen, res.Stdout)
			}
			if seen[0] != seen[1] {
				t.Errorf("%s: two jobs saw %q and %q; want the same", mod, seen[0], seen[1])
			}
		})
	}
}

// ompThreads prints the thread counts of the OpenMP pools the preloaded
// modules loaded (scikit-learn's).
const ompThreads = "import threadpoolctl\nprint(sorted({p['num_threads'] for p in threadpoolctl.threadpool_info() if p['user_api'] == 'openmp'}))"

// pyQuote is s as a Python string literal.
func pyQuote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// What matplotlib holds, every random generator's next draw, and a figure
// and rc change the job leaves behind.
const matplotlibState = `
import json, random, sys, hashlib
import numpy as np, sympy.core.random as sr
import matplotlib, matplotlib.pyplot as plt
rc = {k: repr(v) for k, v in matplotlib.rcParams.items() if k != 'backend'}
print(json.dumps({"figs": plt.get_fignums(), "backend": matplotlib.get_backend().lower(),
  "rc": hashlib.sha256(json.dumps(rc, sort_keys=True).encode()).hexdigest(),
  "orig": matplotlib.rcParamsOrig == matplotlib.rcParams,
  "lw": matplotlib.rcParams["lines.linewidth"]}))
print(json.dumps([random.random(), float(np.random.rand()), sr.rng.random()]))
plt.figure(); plt.plot([1, 2]); plt.savefig('/tmp/x.png')
matplotlib.rcParams["lines.linewidth"] = 9
random.seed(1); np.random.seed(1)
`

// Two consecutive jobs of a preloaded box see the same fresh matplotlib
// state (no figure, the rcParams of a fresh import, as a box that preloads
// nothing shows) and different draws from every random generator.
func TestPreloadFreshStateAndDraws(t *testing.T) {
	t.Parallel()
	rt := setupPreloaded(t)
	var states, draws []string
	for range 2 {
		res, _ := runStored(t, rt, py(matplotlibState))
		if res.Status != job.StatusSucceeded {
			t.Fatalf("%s %+v\n%s", res.Status, res.Error, res.Stderr)
		}
		l := strings.Split(strings.TrimSpace(res.Stdout), "\n")
		states, draws = append(states, l[0]), append(draws, l[1])
	}
	if states[0] != states[1] {
		t.Errorf("matplotlib state: %s then %s; want the same", states[0], states[1])
	}
	var st struct {
		Figs    []int
		Backend string
		LW      float64
	}
	if err := json.Unmarshal([]byte(states[0]), &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Figs) != 0 || !strings.EqualFold(st.Backend, "agg") || st.LW != 1.5 {
		t.Errorf("matplotlib state %s; want no figure, Agg, the default line width", states[0])
	}
	var a, b []float64
	if json.Unmarshal([]byte(draws[0]), &a) != nil || json.Unmarshal([]byte(draws[1]), &b) != nil || len(a) != 3 || len(b) != 3 {
		t.Fatalf("draws %q %q", draws[0], draws[1])
	}
	for i, name := range []string{"random", "numpy.random", "sympy's rng"} {
		if a[i] == b[i] {
			t.Errorf("%s drew %v in both jobs; want each job reseeded", name, a[i])
		}
	}
	// The reference: a box that preloads nothing imports matplotlib in the
	// job itself; its rcParams are what a fresh import gives.
	cold := startRuntime(t, boxConfig(setupConfig(t)))
	res, _ := runStored(t, cold, py(matplotlibState))
	if res.Status != job.StatusSucceeded {
		t.Fatalf("cold: %s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	if got := strings.Split(res.Stdout, "\n")[0]; got != states[0] {
		t.Errorf("preloaded matplotlib state %s; a fresh import's is %s", states[0], got)
	}
}

// A chart job that neither shows nor saves its figure gets it back as a
// PNG output, from a box whose zygote preloaded pyplot.
func TestPreloadChartWithoutSavefig(t *testing.T) {
	t.Parallel()
	rt := setupPreloaded(t)
	res, _ := runStored(t, rt, py("import matplotlib.pyplot as plt\nplt.bar(['a', 'b'], [3, 5])\nplt.title('t');\n"))
	if res.Status != job.StatusSucceeded {
		t.Fatalf("%s %+v\n%s", res.Status, res.Error, res.Stderr)
	}
	if len(res.Outputs) != 1 || !res.Outputs[0].Has(job.MIMEPNG) {
		t.Fatalf("outputs %+v; want the figure as one PNG", res.Outputs)
	}
	requirePNG(t, res.Outputs[0].Text(job.MIMEPNG))
}

// importVars prints what sympy and openpyxl made of the variables they read
// only at import (preloader.IMPORT_VARS).
const importVars = "from sympy.core import cache; import openpyxl; print(cache.USE_CACHE, openpyxl.LXML)"

// Variables a preloaded module read at import take effect when the job
// sets them: MPLBACKEND (a backend that draws into a file; an interactive
// one is Agg, as it is without preloading), MPLCONFIGDIR with its
// matplotlibrc, a matplotlibrc in the work dir, the threading variables on
// the thread pools the loaded libraries hold, and sympy's and openpyxl's
// variables (the job imports those packages afresh).
func TestPreloadEnvTakesEffect(t *testing.T) {
	t.Parallel()
	rt := setupPreloaded(t)
	for _, c := range []struct {
		name  string
		env   map[string]string
		files []job.File
		code  string
		want  string
	}{
		{"MPLBACKEND svg", map[string]string{"MPLBACKEND": "svg"}, nil,
			"import matplotlib; print(matplotlib.get_backend())", "svg"},
		{"MPLBACKEND interactive", map[string]string{"MPLBACKEND": "TkAgg"}, nil,
			"import matplotlib; print(matplotlib.get_backend())", "agg"},
		{"MPLCONFIGDIR", map[string]string{"MPLCONFIGDIR": "/work/cfg"},
			[]job.File{{Name: "cfg/matplotlibrc", Content: "lines.linewidth: 7\n"}},
			"import matplotlib; print(matplotlib.get_configdir(), matplotlib.rcParams['lines.linewidth'], matplotlib.rcParamsOrig['lines.linewidth'])",
			"/work/cfg 7.0 7.0"},
		{"matplotlibrc in the work dir", nil,
			[]job.File{{Name: "matplotlibrc", Content: "axes.titlesize: 31\n"}},
			"import matplotlib; print(matplotlib.rcParams['axes.titlesize'])", "31.0"},
		{"a config dir of its own", nil, nil,
			"import os, matplotlib\nd = os.path.realpath(os.environ['MPLCONFIGDIR'])\nprint(matplotlib.get_configdir() == d, matplotlib.get_cachedir() == d, os.access(d, os.W_OK))", "True True True"},
		{"SYMPY_USE_CACHE and OPENPYXL_LXML", map[string]string{"SYMPY_USE_CACHE": "no", "OPENPYXL_LXML": "False"}, nil,
			importVars, "no False"},
		{"no import-time variables", nil, nil, importVars, "yes True"},
		{"OMP_NUM_THREADS", map[string]string{"OMP_NUM_THREADS": "2"}, nil, ompThreads, "[2]"},
		{"no OMP_NUM_THREADS: the CPU quota's", nil, nil, "import os\n" + ompThreads + "\nprint(os.environ['OMP_NUM_THREADS'])", "[1]\n1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := py(c.code)
			spec.Env = c.env
			spec.Files = c.files
			res, _ := runStored(t, rt, spec)
			if res.Status != job.StatusSucceeded {
				t.Fatalf("%s %+v\n%s", res.Status, res.Error, res.Stderr)
			}
			if got := strings.ToLower(strings.TrimSpace(res.Stdout)); got != strings.ToLower(c.want) {
				t.Errorf("stdout %q; want %q", got, c.want)
			}
		})
	}
}

// What the preload leaves behind changes no result: a chart (its PNG
// output, and the bytes savefig writes as PNG and PDF with a font
// embedded), seaborn's, sympy's, pandas' and scikit-learn's answers, and
// the thread pools scikit-learn limits (its controller, which the zygote
// made), are the same byte for byte from a box whose zygote preloaded the
// list as from a box that preloads nothing; and the job's figures are
// numbered from 1, as in a fresh interpreter.
func TestPreloadInvisible(t *testing.T) {
	t.Parallel()
	const program = `
import hashlib, io
import matplotlib.pyplot as plt, numpy as np, pandas as pd, seaborn as sns, sympy as sp
def digest(fig, fmt):
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, bbox_inches="tight", metadata={"CreationDate": None} if fmt == "pdf" else None)
    return hashlib.sha256(buf.getvalue()).hexdigest()[:16]
fig, ax = plt.subplots(2, 1)
ax[0].plot([0, 1, 2], [2, 0, 1], label="sales")
ax[0].set_title("Revenue by quarter")
ax[0].legend()
ax[1].hist(np.cos(np.linspace(0, 9, 50)), bins=7)
fig.tight_layout()
print(fig.number, digest(fig, "png"), digest(fig, "pdf"))
plt.close(fig)
f2 = plt.figure()
sns.heatmap(np.arange(9).reshape(3, 3), annot=True)
print(f2.number, digest(f2, "png"))
plt.close(f2)
x = sp.Symbol("x")
print(sp.integrate(sp.cos(x) * x, x), sp.solve(x**2 - 3*x + 2, x), sp.factor(sp.expand((x + 2) ** 3)))
df = pd.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 4]})
print(df.groupby("k").v.agg(["sum", "mean"]).to_dict())
from sklearn.cluster import KMeans
from sklearn.utils.fixes import threadpool_info
X = np.r_[np.zeros((5, 2)), np.ones((5, 2)) * 4]
print(sorted(np.bincount(KMeans(2, n_init=2, random_state=0).fit_predict(X))))
print(sorted((i["user_api"], i["filepath"], i["num_threads"]) for i in threadpool_info()))
plt.bar(["q1", "q2"], [3, 5])
plt.title("left open");
`
	preloaded := setupPreloaded(t)
	cold := startRuntime(t, boxConfig(setupConfig(t)))
	var outs [2]job.Result
	// The box that preloads nothing imports four libraries cold: seconds
	// on a loaded host, past the default 10 s on a busy one.
	req := py(program)
	req.Limits.TimeoutMS, req.Limits.CPUMS = 60_000, 60_000
	for i, rt := range []*Containerd{preloaded, cold} {
		res, _ := runStored(t, rt, req)
		if res.Status != job.StatusSucceeded {
			t.Fatalf("box %d: %s %+v\n%s", i, res.Status, res.Error, res.Stderr)
		}
		if len(res.Outputs) != 1 || !res.Outputs[0].Has(job.MIMEPNG) {
			t.Fatalf("box %d: %d outputs; want the figure left open as one PNG", i, len(res.Outputs))
		}
		outs[i] = res
	}
	if outs[0].Stdout != outs[1].Stdout {
		t.Errorf("the preloaded box printed\n%s\na box that preloads nothing\n%s", outs[0].Stdout, outs[1].Stdout)
	}
	if !strings.Contains(outs[0].Stdout, "[('openmp', ") {
		t.Errorf("scikit-learn lists no OpenMP pool to limit: %q", outs[0].Stdout)
	}
	if !strings.HasPrefix(outs[0].Stdout, "1 ") {
		t.Errorf("the job's first figure is not number 1: %q", outs[0].Stdout)
	}
	if outs[0].Outputs[0].Text(job.MIMEPNG) != outs[1].Outputs[0].Text(job.MIMEPNG) {
		t.Errorf("the figure left open renders differently in the preloaded box")
	}
}
