package sandbox

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kilnrun/kiln/job"
)

// agentProgram is a program of the kind LLM agents write for a code
// interpreter, with its input files and the exact output it must print.
type agentProgram struct {
	name  string
	code  string
	files []job.File
	want  string
}

const salesCSV = `date,region,product,units,price
2024-01-03,north,widget,10,2.50
2024-01-04,south,widget,,2.50
2024-01-04,north,gadget,3,10.00
2024-01-05,south,gadget,5,10.00
2024-01-05,south,gadget,5,10.00
2024-01-06,east,widget,7,n/a
`

var agentPrograms = []agentProgram{
	{"stats mean median stdev", `import statistics as s
xs = [2, 4, 4, 4, 5, 5, 7, 9]
print(s.mean(xs), s.median(xs), s.pstdev(xs))`, nil, "5 4.5 2.0\n"},
	{"numpy linear algebra", `import numpy as np
a = np.array([[3, 1], [1, 2]]); b = np.array([9, 8])
print(np.linalg.solve(a, b).round(6).tolist(), int(np.linalg.det(a).round()))`, nil, "[2.0, 3.0] 5\n"},
	{"pandas CSV cleanup", `import pandas as pd
df = pd.read_csv("data/sales.csv")
df["price"] = pd.to_numeric(df["price"], errors="coerce")
df = df.drop_duplicates().dropna(subset=["units", "price"])
df["revenue"] = df["units"] * df["price"]
out = df.groupby("region")["revenue"].sum().sort_index()
print(out.to_dict())
out.to_csv("/tmp/summary.csv")
print(open("/tmp/summary.csv").read().strip().splitlines()[1])`, []job.File{{Name: "data/sales.csv", Content: salesCSV}}, "{'north': 55.0, 'south': 50.0}\nnorth,55.0\n"},
	{"pandas pivot and describe", `import pandas as pd
df = pd.DataFrame({"k": ["a", "b", "a", "b"], "v": [1, 2, 3, 4]})
print(df.pivot_table(index="k", values="v", aggfunc="sum")["v"].tolist(), df["v"].describe()["mean"])`, nil, "[4, 6] 2.5\n"},
	{"pandas dates resample", `import pandas as pd
s = pd.Series(range(10), index=pd.date_range("2024-01-01", periods=10, freq="D"))
print(s.resample("W").sum().tolist())`, nil, "[21, 24]\n"},
	{"matplotlib chart saved to /tmp", `import matplotlib
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.plot([1, 2, 3], [4, 1, 9]); ax.set_title("t")
fig.savefig("/tmp/chart.png")
print(matplotlib.get_backend().lower(), open("/tmp/chart.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n")`, nil, "agg True\n"},
	{"seaborn plot", `import seaborn as sns, pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"x": [1, 2, 3, 4], "y": [1, 4, 9, 16]})
ax = sns.lineplot(data=df, x="x", y="y")
plt.savefig("/tmp/sns.png")
print(len(ax.lines))`, nil, "1\n"},
	{"scipy optimize", `from scipy.optimize import minimize
r = minimize(lambda v: (v[0] - 3) ** 2 + (v[1] + 1) ** 2, [0, 0])
print([round(x, 3) for x in r.x], r.success)`, nil, "[3.0, -1.0] True\n"},
	{"scipy stats t-test", `from scipy import stats
t, p = stats.ttest_ind([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
print(round(t, 4), round(p, 5))`, nil, "-5.0 0.00105\n"},
	{"scipy integrate", `from scipy.integrate import quad
import math
v, err = quad(math.sin, 0, math.pi)
print(round(v, 6))`, nil, "2.0\n"},
	{"sympy solve and diff", `import sympy as sp
x = sp.symbols("x")
print(sp.solve(x**2 - 5*x + 6, x), sp.diff(sp.sin(x) * x, x), sp.integrate(2*x, (x, 0, 3)))`, nil, "[2, 3] x*cos(x) + sin(x) 9\n"},
	{"sklearn linear regression", `from sklearn.linear_model import LinearRegression
import numpy as np
X = np.array([[1], [2], [3], [4]]); y = 2 * X.ravel() + 1
m = LinearRegression().fit(X, y)
print(round(m.coef_[0], 6), round(m.intercept_, 6), round(m.score(X, y), 6))`, nil, "2.0 1.0 1.0\n"},
	{"sklearn classification", `from sklearn.datasets import load_iris
from sklearn.tree import DecisionTreeClassifier
X, y = load_iris(return_X_y=True)
clf = DecisionTreeClassifier(random_state=0).fit(X, y)
print(X.shape, clf.score(X, y))`, nil, "(150, 4) 1.0\n"},
	{"statsmodels OLS", `import numpy as np, statsmodels.api as sm
x = np.arange(10.0); y = 3 * x + 2
r = sm.OLS(y, sm.add_constant(x)).fit()
print([round(p, 6) for p in r.params])`, nil, "[2.0, 3.0]\n"},
	{"networkx shortest path", `import networkx as nx
g = nx.Graph(); g.add_weighted_edges_from([("a", "b", 1), ("b", "c", 2), ("a", "c", 5)])
print(nx.shortest_path(g, "a", "c", weight="weight"), nx.shortest_path_length(g, "a", "c", weight="weight"))`, nil, "['a', 'b', 'c'] 3\n"},
	{"openpyxl spreadsheet", `from openpyxl import Workbook, load_workbook
wb = Workbook(); ws = wb.active
ws.append(["name", "qty"]); ws.append(["a", 2]); ws.append(["b", 3]); ws["C1"] = "=SUM(B2:B3)"
wb.save("/tmp/book.xlsx")
ws2 = load_workbook("/tmp/book.xlsx").active
print(ws2.max_row, ws2["B3"].value, ws2["C1"].value)`, nil, "3 3 =SUM(B2:B3)\n"},
	{"pandas excel round trip", `import pandas as pd
pd.DataFrame({"a": [1, 2]}).to_excel("/tmp/x.xlsx", index=False)
print(pd.read_excel("/tmp/x.xlsx")["a"].sum())`, nil, "3\n"},
	{"bs4 html parse", `from bs4 import BeautifulSoup
html = open("page.html").read()
soup = BeautifulSoup(html, "html.parser")
print([a["href"] for a in soup.find_all("a")], soup.title.string)`, []job.File{{Name: "page.html", Content: `<html><head><title>T</title></head><body><a href="/x">x</a><a href="/y">y</a></body></html>`}}, "['/x', '/y'] T\n"},
	{"lxml xpath", `from lxml import etree, html
doc = html.fromstring("<ul><li>1</li><li>2</li></ul>")
print(doc.xpath("//li/text()"), etree.tostring(etree.fromstring("<a><b/></a>")).decode())`, nil, "['1', '2'] <a><b/></a>\n"},
	{"yaml load and dump", `import yaml
d = yaml.safe_load("a: 1\nb: [x, y]\n")
print(d, yaml.safe_dump({"k": [1, 2]}).strip())`, nil, "{'a': 1, 'b': ['x', 'y']} k:\n- 1\n- 2\n"},
	{"dateutil and pytz", `from dateutil import parser, relativedelta
import pytz
d = parser.parse("2024-03-10T12:00:00Z")
print(d.astimezone(pytz.timezone("America/New_York")).isoformat(), (d + relativedelta.relativedelta(months=1)).date())`, nil, "2024-03-10T08:00:00-04:00 2024-04-10\n"},
	{"zoneinfo stdlib", `from zoneinfo import ZoneInfo
from datetime import datetime
print(datetime(2024, 7, 1, 12, tzinfo=ZoneInfo("Europe/Paris")).utcoffset())`, nil, "2:00:00\n"},
	{"pillow image", `from PIL import Image
im = Image.new("RGB", (4, 3), (255, 0, 0)); im.save("/tmp/a.png")
print(Image.open("/tmp/a.png").size, im.getpixel((0, 0)))`, nil, "(4, 3) (255, 0, 0)\n"},
	{"tabulate table", `from tabulate import tabulate
print(tabulate([["a", 1], ["b", 22]], headers=["k", "v"], tablefmt="github"))`, nil, "| k   |   v |\n|-----|-----|\n| a   |   1 |\n| b   |  22 |\n"},
	{"requests imports (no network)", `import requests
try:
    requests.get("http://10.255.255.1/", timeout=2)
except requests.exceptions.RequestException as e:
    print("refused", type(e).__name__ in ("ConnectionError", "ConnectTimeout"))`, nil, "refused True\n"},
	{"jinja2 template", `from jinja2 import Template
print(Template("Hello {{ name }}! {% for i in xs %}{{ i }}{% endfor %}").render(name="kiln", xs=[1, 2]))`, nil, "Hello kiln! 12\n"},
	{"json from input file", `import json
d = json.load(open("in.json"))
print(json.dumps({k: d[k] * 2 for k in sorted(d)}, sort_keys=True))`, []job.File{{Name: "in.json", Content: `{"b": 2, "a": 1}`}}, "{\"a\": 2, \"b\": 4}\n"},
	{"csv module", `import csv, io
rows = list(csv.DictReader(io.StringIO("a,b\n1,2\n3,4\n")))
print(sum(int(r["a"]) + int(r["b"]) for r in rows))`, nil, "10\n"},
	{"regex", `import re
print(re.findall(r"\d+", "a1b22c333"), re.sub(r"(\w+)@(\w+)", r"\2 at \1", "me@host"))`, nil, "['1', '22', '333'] host at me\n"},
	{"datetime arithmetic", `from datetime import date, timedelta
print((date(2024, 3, 1) - date(2024, 2, 1)).days, date(2024, 1, 31) + timedelta(days=30))`, nil, "29 2024-03-01\n"},
	{"itertools and collections", `import itertools, collections
print(list(itertools.combinations("abc", 2)), collections.Counter("mississippi").most_common(2))`, nil, "[('a', 'b'), ('a', 'c'), ('b', 'c')] [('i', 4), ('s', 4)]\n"},
	{"fractions decimal math", `from fractions import Fraction
from decimal import Decimal
import math
print(Fraction(1, 3) + Fraction(1, 6), Decimal("0.1") + Decimal("0.2"), math.comb(10, 3), math.isqrt(99))`, nil, "1/2 0.3 120 9\n"},
	{"sqlite in memory", `import sqlite3
c = sqlite3.connect(":memory:")
c.execute("create table t(x)"); c.executemany("insert into t values (?)", [(1,), (2,), (3,)])
print(c.execute("select sum(x), avg(x) from t").fetchone())`, nil, "(6, 2.0)\n"},
	{"stdin lines", `import sys
print(sum(int(l) for l in sys.stdin))`, nil, "6\n"},
	{"xlsxwriter and docx", `import xlsxwriter, docx
wb = xlsxwriter.Workbook("/tmp/w.xlsx"); wb.add_worksheet().write(0, 0, "hi"); wb.close()
d = docx.Document(); d.add_paragraph("para"); d.save("/tmp/d.docx")
print(docx.Document("/tmp/d.docx").paragraphs[0].text)`, nil, "para\n"},
}

// TestAgentProgramsOnPython runs the typical agent workload on the default
// image: every program must succeed with its exact output.
func TestAgentProgramsOnPython(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "python")
	if len(agentPrograms) < 30 {
		t.Fatalf("only %d agent programs; the suite promises at least 30", len(agentPrograms))
	}
	for _, p := range agentPrograms {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			spec := job.Spec{Runtime: "python", Code: p.code, Files: p.files, Limits: job.Limits{TimeoutMS: 60_000, CPUMS: 60_000, MemoryMB: 512}}
			if p.name == "stdin lines" {
				spec.Stdin = "1\n2\n3\n"
			}
			requireSucceeded(t, run(t, rt, spec), p.want)
		})
	}
}

// importCheck is one import an agent program starts with, and the runtimes
// whose image has it.
var importChecks = []struct {
	module string
	slim   bool // python-slim has it too
}{
	{"numpy", true}, {"json", true}, {"csv", true}, {"sqlite3", true}, {"statistics", true}, {"zoneinfo", true},
	{"pandas", false}, {"scipy", false}, {"sklearn", false}, {"matplotlib", false}, {"seaborn", false},
	{"statsmodels", false}, {"sympy", false}, {"networkx", false}, {"openpyxl", false}, {"bs4", false},
	{"lxml", false}, {"yaml", false}, {"PIL", false}, {"tabulate", false}, {"dateutil", false}, {"pytz", false},
	{"requests", false},
}

// TestImportSubsetOnPythonSlim runs the import-only subset on python-slim:
// what it has imports; what only python has fails as a runtime error naming
// the module and the runtime that has it.
func TestImportSubsetOnPythonSlim(t *testing.T) {
	t.Parallel()
	rt := setupRuntimes(t, "python-slim", "python")
	for _, c := range importChecks {
		t.Run(c.module, func(t *testing.T) {
			t.Parallel()
			res := run(t, rt, job.Spec{Runtime: "python-slim", Code: fmt.Sprintf("import %s\nprint('ok')", c.module)})
			if c.slim {
				requireSucceeded(t, res, "ok\n")
				return
			}
			requireFailed(t, res, job.StatusFailed, job.CategoryRuntimeError,
				fmt.Sprintf("module %q is not installed in the python-slim runtime's image", c.module))
			if !strings.Contains(res.Error.Message, "runtime python has it") {
				t.Errorf("message %q does not name the python runtime", res.Error.Message)
			}
		})
	}
}
