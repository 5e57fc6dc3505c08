package runtimes

import "testing"

// A python program runs lean only when each of its imports is plainly of
// the standard library; anything else, or anything the scan cannot read,
// takes the preloaded box.
func TestNeedsPreload(t *testing.T) {
	py := Profile{Language: "python", Preload: []string{"numpy", "pandas"}}
	for code, want := range map[string]bool{
		"print(1)": false,
		"import os, sys as s\nfrom collections import deque":   false,
		"import json\nprint(json.dumps({'import': 1}))":        true, // "import" the scan cannot read
		"from os.path import (join,\n  split)":                 false,
		"x = 1; import math":                                   false,
		"def f():\n    import re\n    return re":               false,
		"import pandas as pd":                                  true,
		"import os, numpy":                                     true,
		"from sklearn.linear_model import LinearRegression":    true,
		"import matplotlib.pyplot as plt":                      true,
		"import helper":                                        true, // a module of the job's files
		"from . import x":                                      true,
		"m = __import__('pandas')":                             true,
		"import importlib\nimportlib.import_module('scipy')":   true,
		"exec('import pandas')":                                true,
		"s = 'please import this'":                             false, // read as "import this", of the standard library
		"if True: import numpy":                                true,
		"try:\n    import yaml\nexcept ImportError:\n    pass": true,
	} {
		if got := py.NeedsPreload(code); got != want {
			t.Errorf("%q: NeedsPreload %v; want %v", code, got, want)
		}
	}
	if (Profile{Language: "python"}).NeedsPreload("import pandas") {
		t.Error("a runtime that preloads nothing: a program needs no preload")
	}
	if !(Profile{Language: "javascript", Preload: []string{"lodash"}}).NeedsPreload("console.log(1)") {
		t.Error("another language: the preload is always taken")
	}
}
