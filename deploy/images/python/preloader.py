"""Python's preloader: the modules a sandbox imports before its job arrives
(KILN_PRELOAD, from the runtime profile's "preload" list in runtime.json),
and what keeps that preloading invisible to the job.

A box's zygote (box.py) imports them once and forks every job from the
result, so a job's own `import matplotlib.pyplot` is a dictionary lookup.
Whatever a fresh interpreter would have done differently for the job is
done again for it here:

  - random generators: every generator the preloaded modules keep in a
    module global (random's, numpy's legacy global, sympy's, ...) was
    seeded once, in the zygote; reseed() seeds each anew in every job
    (and a session's interpreter), so forked jobs never draw the same
    numbers. The generators are found once, after preloading.
  - what a module reads from the environment at import: the job's env is
    applied after the import already happened, so fresh(env) reads again
    what the job changed: MPLBACKEND (matplotlib.use), MPLCONFIGDIR, MPLRC
    or a matplotlibrc in the job's work dir (rcParams read again from the
    file a fresh import would read), and the threading variables
    OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS,
    BLIS_NUM_THREADS (applied with threadpoolctl to the thread pools the
    loaded libraries have); a variable that sympy, mpmath or openpyxl
    reads only at import (IMPORT_VARS) makes the job import the package
    afresh. Variables read by a library that is loaded later, by the job
    itself, need nothing.
  - matplotlib's state: the zygote never runs a job; it draws one chart
    of its own (warm_matplotlib), so a job's first chart finds matplotlib's
    lazily loaded parts loaded, and closes it: each job forks from an
    interpreter with no figure, the rcParams of a fresh import and no font
    file open; matplotlib's config and cache dirs are resolved again by
    the job (in its own /tmp) instead of the zygote's.
  - sympy's first use: the zygote asks sympy a few questions of its own
    (warm_sympy), so what sympy builds on first use is built; its cache
    keeps the answers' parts, which changes no answer.
  - scikit-learn's first estimator that limits its threads: the zygote
    makes the thread-pool controller sklearn keeps (warm_sklearn), which
    lists the libraries a job's would list.
  - files, threads, sockets: the jail closes every descriptor the job was
    not given, and a forked process holds one thread, so nothing a
    preloaded module opened is the job's to see.

matplotlib's font cache is built when the image is built (recipe.sh,
FONT_CACHE) and copied into the preloading process's config dir, so
preloading does not spend seconds listing fonts in every box.
"""

import os
import sys

import runner

# The font cache the image build made (recipe.sh customize).
FONT_CACHE = "/usr/lib/kiln/matplotlib"

# Threading variables a loaded library read when it was loaded, and the
# threadpoolctl API that sets the same limit afterwards.
THREAD_VARS = (
    ("OMP_NUM_THREADS", "openmp"),
    ("OPENBLAS_NUM_THREADS", "blas"),
    ("MKL_NUM_THREADS", "blas"),
    ("BLIS_NUM_THREADS", "blas"),
)

# Preloaded packages of pure Python that read variables only at import (how
# they compute is fixed then), each with the prefixes of those variables and
# the preloaded packages built on it: a job that sets one imports them
# afresh, as a fresh interpreter would (fresh).
IMPORT_VARS = (
    ("mpmath", ("MPMATH_", "SAGE_ROOT"), ("sympy",)),
    ("sympy", ("SYMPY_", "USE_SYMENGINE"), ()),
    ("openpyxl", ("OPENPYXL_",), ()),
)

# Every generator found after preloading: (module name, attribute name).
generators = []


def preload(names):
    """Imports the modules a sandbox is asked to preload (comma-separated)
    while it waits for its job, so the job's own import of them is a
    dictionary lookup. A module that fails to import is skipped: the job
    then imports it itself and sees the error as usual. Nothing is
    printed: whatever this writes before the job arrives is discarded."""
    seed_font_cache()
    for name in names.split(","):
        name = name.strip()
        if not name:
            continue
        try:
            __import__(name)
        except BaseException:  # noqa: BLE001 -- a broken module must not end the launcher
            pass
    mpl = sys.modules.get("matplotlib")
    if mpl is not None:
        warm_matplotlib(mpl)
        forget_dirs(mpl)
    if "sympy" in sys.modules:
        warm_sympy()
    if "sklearn" in sys.modules:
        warm_sklearn()
    find_generators()
    # What is loaded now lives as long as the process: keep the collector
    # from walking it again in every collection (and in runner.finish()),
    # once the warm-up's garbage is gone.
    import gc

    gc.collect()
    gc.freeze()


def warm_matplotlib(mpl):
    """Draws one chart the way a job's figures are drawn (runner.tight_png),
    then closes it: the fonts, glyphs and text metrics a chart's first
    drawing loads are then loaded in every job forked from here. What a
    job can see is left as a fresh import leaves it: no figure (the next
    is number 1), the same rcParams (and the backend resolved again by the
    job's first figure, as pyplot resolves it), no warning recorded, and no
    font file held open (matplotlib keeps each font it loaded open, and a
    job's jail closes every descriptor it was not given: the job opens
    its fonts itself)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    import warnings

    # rcParams and the two copies pyplot writes the backend it resolves into.
    params = [getattr(mpl, n) for n in ("rcParams", "rcParamsOrig", "rcParamsDefault")]
    saved = [dict(dict.items(p)) for p in params]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig, (top, bottom) = plt.subplots(2, 1)
            top.bar(["a", "b"], [1.5, 2], label="bars")
            top.set_title("Title")
            top.set_ylabel("value")
            top.legend()
            bottom.plot([0.0, 1.0, 2.0], [2.0, 0.0, 1.0])
            bottom.hist([0.1, 0.5, 0.5, 0.9], bins=3)
            bottom.set_xlabel("x")
            fig.tight_layout()
            runner.tight_png(fig, fig.dpi)
    except Exception:  # noqa: BLE001 -- a job then pays its first chart itself
        pass
    finally:
        try:
            plt.close("all")
        except Exception:  # noqa: BLE001
            pass
        for p, kept in zip(params, saved):
            dict.clear(p)
            dict.update(p, kept)
        fonts = getattr(sys.modules.get("matplotlib.font_manager"), "_get_font", None)
        if fonts is not None and hasattr(fonts, "cache_clear"):
            fonts.cache_clear()


def warm_sympy():
    """Asks sympy once for what agents ask it most (solve, integrate,
    simplify, expand, factor, diff, limit, series, a matrix inverse, the
    printed answer), on symbols of its own. sympy builds much of what it
    computes with on first use and keeps it: the tables and dummies of its
    integrators (heurisch's Bessel table, made at its first integral), the
    polynomial rings and domains its solvers work in, and its cache of the
    numbers and functions answers are made of. All of that is then built
    in every job forked from here. sympy's cache is transparent by design
    (the same answers with SYMPY_USE_CACHE=no) and bounded (SYMPY_CACHE_SIZE
    entries a function); a job that sets a variable sympy reads at import
    imports sympy afresh (fresh). TestPreloadInvisible compares sympy's
    answers with a box that preloads nothing."""
    try:
        import sympy as sp

        u, v = sp.symbols("u_ v_")
        answers = [
            sp.solve(u**2 - 2 * u - 3, u),
            sp.solve([u + v - 3, u - v - 1], [u, v]),
            sp.integrate(u**2 * sp.cos(u), u),
            sp.integrate(u * sp.exp(2 * u), u),
            sp.integrate(sp.sqrt(1 - u**2), u),
            sp.integrate(1 / (u**2 + 1), (u, 0, 1)),
            sp.simplify(sp.sin(u) ** 2 + sp.cos(u) ** 2 + (u**2 - 1) / (u - 1)),
            sp.factor(sp.expand((u + v) ** 3)),
            sp.diff(u * sp.log(u), u),
            sp.limit(sp.sin(u) / u, u, 0),
            sp.series(sp.exp(u), u, 0, 4),
            sp.Matrix([[1, 2], [3, 4]]).inv(),
        ]
        for a in answers:
            str(a)
    except Exception:  # noqa: BLE001 -- a job then pays sympy's first use itself
        pass


def warm_sklearn():
    """Makes the thread-pool controller scikit-learn makes at the first
    estimator that limits its threads (KMeans, ...) and keeps for the
    process (sklearn.utils.fixes._get_threadpool_controller): threadpoolctl
    finds the BLAS and OpenMP libraries loaded by walking every shared
    library of the process, ~10 ms in a job. Made here, once the preloaded
    modules have loaded theirs, it lists what a job's first estimator would
    list: the python image's only such libraries are libgomp and the
    reference BLAS, both loaded by the preload (a library a job loads
    itself later is not in it, as it would not be after the job's first
    estimator). It reads each library's thread count when asked, so a job's
    OMP_NUM_THREADS still counts; it holds no descriptor and starts no
    thread (OpenMP makes its pool at the first parallel region, in a job).
    TestPreloadInvisible compares what it lists with a box that preloads
    nothing."""
    try:
        from sklearn.utils import fixes

        fixes._get_threadpool_controller()
    except Exception:  # noqa: BLE001 -- a job then makes it itself
        pass


def seed_font_cache():
    """Copies the image's matplotlib font cache into the config dir this
    process's matplotlib will use, unless one is there."""
    dest = os.environ.get("MPLCONFIGDIR")
    if not dest:
        return
    try:
        names = [n for n in os.listdir(FONT_CACHE) if n.startswith("fontlist-")]
    except OSError:
        return
    try:
        os.makedirs(dest, exist_ok=True)
        for n in names:
            target = os.path.join(dest, n)
            if os.path.exists(target):
                continue
            with open(os.path.join(FONT_CACHE, n), "rb") as src, open(target, "wb") as out:
                out.write(src.read())
    except OSError:
        pass


def forget_dirs(mpl):
    """matplotlib resolves its config and cache dirs once and keeps them: the
    zygote's are not the job's (each job has its own /tmp and may name its
    own MPLCONFIGDIR). Each getter is made anew from the function it wraps,
    so the first call in the job resolves them again."""
    for name, fmt in (("get_configdir", "CONFIGDIR=%s"), ("get_cachedir", "CACHEDIR=%s")):
        fn = getattr(mpl, name, None)
        inner = getattr(fn, "__wrapped__", None)
        cached = getattr(mpl, "_logged_cached", None)
        if inner is None or cached is None:
            continue
        setattr(mpl, name, cached(fmt)(inner))


def find_generators():
    """Finds the random generators the preloaded modules keep in their
    globals (once, in the preloading process)."""
    import random

    kinds = [random.Random]
    np = sys.modules.get("numpy")
    if np is not None:
        kinds += [np.random.RandomState, np.random.Generator]
    kinds = tuple(kinds)
    del generators[:]
    for modname, mod in list(sys.modules.items()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for attr, v in list(d.items()):
            if isinstance(v, kinds) and not isinstance(v, random.SystemRandom):
                generators.append((modname, attr))


def reseed():
    """Seeds every generator the preload may have seeded anew, from the
    system's entropy: forked jobs must not draw the same numbers."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    for modname, attr in generators:
        g = getattr(sys.modules.get(modname), attr, None)
        try:
            if isinstance(g, random.Random):
                g.seed()
            elif np is not None and isinstance(g, np.random.Generator):
                g.bit_generator.state = type(g.bit_generator)().state
            elif g is not None:
                g.seed()
        except Exception:  # noqa: BLE001
            pass
    if np is not None:
        try:
            np.random.seed()
        except Exception:  # noqa: BLE001
            pass


def fresh(env):
    """Called after a job's env is applied, before its code runs: reads
    again what a preloaded module read from the environment at import and
    the job changed (env: the job's own variables)."""
    forget_packages(env)
    mpl = sys.modules.get("matplotlib")
    if mpl is not None:
        fresh_matplotlib(mpl, env)
    limits = [(int(env[k]), api) for k, api in THREAD_VARS if env.get(k, "").strip().isdigit() and int(env[k]) > 0]
    if limits:
        try:
            import threadpoolctl

            for n, api in limits:
                threadpoolctl.threadpool_limits(limits=n, user_api=api)
        except Exception:  # noqa: BLE001 -- as an unloadable pool would be, unlimited
            pass


def forget_packages(env):
    """Drops from sys.modules every package of IMPORT_VARS (and those built
    on it) whose import-time variables the job's env sets, so the job's own
    import runs the package's import code again and reads them."""
    names = set()
    for pkg, prefixes, dependents in IMPORT_VARS:
        if pkg in sys.modules and any(k.startswith(prefixes) for k in env):
            names.add(pkg)
            names.update(dependents)
    if not names:
        return
    for mod in list(sys.modules):
        if mod.split(".", 1)[0] in names:
            del sys.modules[mod]


def fresh_matplotlib(mpl, env):
    try:
        reread = "MPLCONFIGDIR" in env or "MPLRC" in env or os.path.exists("matplotlibrc")
        if reread:
            forget_dirs(mpl)
            rc = dict(dict.items(mpl.rcParamsDefault))
            rc.update(dict.items(mpl._rc_params_in_file(mpl.matplotlib_fname())))
            rc.pop("backend", None)  # the backend is chosen below, as at import
            dict.update(mpl.rcParams, rc)
            mpl.rcParamsOrig = mpl.rcParams.copy()
        if "MPLBACKEND" in env:
            mpl.use(runner.file_backend(env["MPLBACKEND"]), force=False)
    except Exception:  # noqa: BLE001 -- the job then sees the preloaded defaults
        pass
