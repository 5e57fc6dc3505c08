// The E2B contract: drives E2B's published code-interpreter SDK, unmodified,
// against the API named by E2B_API_URL and E2B_SANDBOX_URL, with the key in
// E2B_API_KEY (internal/e2e TestE2BContract). The SDK release is the package
// alias given as the first argument (package.json). It prints one JSON
// report on stdout; the Go test judges it. A step that throws fails the
// run with the step's name.
'use strict'

const pkg = process.argv[2]
const run = process.argv[3]
const { Sandbox } = require(pkg)

const report = { pkg, steps: {} }
let step = ''

async function main() {
  step = 'create'
  const sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { suite: 'e2b-contract', run }, envs: { GREETING: 'hello from envs' } })
  report.sandboxId = sbx.sandboxId

  step = 'runCode stdout and envs'
  let ex = await sbx.runCode('import os\nx = 41\nprint(os.environ["GREETING"])')
  report.steps.stdout = { stdout: ex.logs.stdout, stderr: ex.logs.stderr, error: ex.error || null, count: ex.executionCount }

  step = 'runCode state'
  ex = await sbx.runCode('x + 1')
  report.steps.state = { text: ex.text, main: ex.results.map((r) => r.isMainResult) }

  step = 'runCode DataFrame'
  ex = await sbx.runCode('import pandas as pd\ndf = pd.DataFrame({"a": [1, 2], "b": [3, 4]})\ndf')
  report.steps.dataframe = { formats: ex.results.map((r) => r.formats()), html: ex.results.map((r) => r.html || '') }

  step = 'runCode chart'
  ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title("kiln")')
  report.steps.chart = { formats: ex.results.map((r) => r.formats()), png: ex.results.map((r) => (r.png || '').length), error: ex.error || null }

  step = 'runCode exception'
  const seen = []
  ex = await sbx.runCode('def f():\n    return 1 / 0\nf()', { onError: (e) => seen.push(e.name) })
  report.steps.exception = { name: ex.error && ex.error.name, value: ex.error && ex.error.value, traceback: ex.error && ex.error.traceback, callback: seen }

  step = 'runCode streaming callbacks'
  const lines = []
  let firstAt = 0
  const onStdout = (m) => {
    lines.push(m.line)
    firstAt = firstAt || Date.now()
  }
  // "one" is printed 3 s before the call ends: it reaches the callback
  // while the call runs, not with its end.
  ex = await sbx.runCode('import time\nprint("one", flush=True)\ntime.sleep(3)\nprint("two")', { onStdout })
  report.steps.callbacks = { lines, firstBeforeEndMs: Date.now() - firstAt }

  step = 'runCode interrupted by its client'
  // The SDK gives up after 2 s and drops the request: the call is
  // interrupted then, not at its own limit, and the next call runs at once.
  const t0 = Date.now()
  let gaveUp = ''
  try {
    await sbx.runCode('import time\nmarker = "before"\nprint("started", flush=True)\ntime.sleep(20)\nmarker = "after"', { timeoutMs: 2000 })
  } catch (e) {
    gaveUp = e.name
  }
  ex = await sbx.runCode('print(marker)')
  report.steps.interrupt = { gaveUp, marker: ex.logs.stdout.join(''), nextDoneMs: Date.now() - t0 }

  step = 'contexts'
  const contexts = await sbx.listCodeContexts()
  report.steps.contexts = { languages: contexts.map((c) => c.language) }

  step = 'js context'
  // A JavaScript call keeps its state for the next (a node session of the
  // sandbox's); a context made for it starts fresh; removed, it is gone.
  const js1 = await sbx.runCode('globalThis.k = 40\nconst add = (a, b) => a + b\nadd(k, 1)', { language: 'javascript' })
  const js2 = await sbx.runCode('console.log("js", add(k, 2))', { language: 'javascript' })
  step = 'js context created'
  const jsctx = await sbx.createCodeContext({ language: 'javascript' })
  const js3 = await sbx.runCode('typeof k', { context: jsctx })
  const withJs = await sbx.listCodeContexts()
  step = 'js context restarted'
  await sbx.runCode('globalThis.q = 1', { context: jsctx })
  await sbx.restartCodeContext(jsctx)
  const js4 = await sbx.runCode('console.log(typeof q)', { context: jsctx })
  step = 'python context restarted'
  // Its variables go, its files stay.
  await sbx.runCode('open("kept.txt", "w").write("kept")')
  const pyctx = (await sbx.listCodeContexts()).find((c) => c.language === 'python')
  await sbx.restartCodeContext(pyctx)
  const py1 = await sbx.runCode('print("x" in globals(), open("kept.txt").read())')
  await sbx.runCode('x = 41') // what the later steps read
  step = 'js context removed'
  await sbx.removeCodeContext(jsctx)
  const afterJs = await sbx.listCodeContexts()
  report.steps.jsContext = {
    first: js1.text, second: js2.logs.stdout, fresh: js3.text, error: js1.error || js2.error || js3.error || null,
    languages: withJs.map((c) => c.language), after: afterJs.map((c) => c.id === jsctx.id),
    restartedJs: js4.logs.stdout, restartedPy: py1.logs.stdout,
  }

  step = 'files write'
  const w = await sbx.files.write('/home/user/data/notes.txt', 'payload 1')
  step = 'files read'
  const read = await sbx.files.read('/home/user/data/notes.txt')
  step = 'files list'
  const top = await sbx.files.list('/home/user')
  const inner = await sbx.files.list('/home/user/data')
  step = 'files seen by code'
  ex = await sbx.runCode('print(open("data/notes.txt").read())')
  step = 'files exists'
  const exists = await sbx.files.exists('/home/user/data/notes.txt')
  step = 'files rename'
  await sbx.files.rename('/home/user/data/notes.txt', '/home/user/data/moved.txt')
  step = 'files remove'
  await sbx.files.write('/home/user/gone.txt', 'x')
  await sbx.files.remove('/home/user/gone.txt')
  const after = await sbx.files.list('/home/user')
  const afterData = await sbx.files.list('/home/user/data')
  step = 'files watchDir'
  const watched = []
  const wh = await sbx.files.watchDir('/home/user/data', (ev) => { watched.push(`${ev.type}:${ev.name}`) })
  await sbx.files.write('/home/user/data/watched.txt', 'w')
  await sbx.files.write('/home/user/elsewhere.txt', 'e')
  for (let i = 0; i < 100 && !watched.includes('create:watched.txt'); i++) {
    await new Promise((r) => setTimeout(r, 100))
  }
  await wh.stop()
  report.steps.files = {
    watched,
    written: w.path, read, code: ex.logs.stdout,
    top: top.map((e) => `${e.type}:${e.name}`), inner: inner.map((e) => `${e.type}:${e.name}:${e.size}`),
    exists, after: after.map((e) => e.name), afterData: afterData.map((e) => e.name),
  }

  step = 'commands run'
  const cr = await sbx.commands.run('echo out-$((6*7)) $CMDV; echo err >&2; pwd; cat data/moved.txt', { envs: { CMDV: 'from envs' }, cwd: '/home/user' })
  step = 'commands exit code'
  let exitErr = null
  try {
    await sbx.commands.run('echo before; exit 3')
  } catch (e) {
    exitErr = { name: e.constructor.name, exitCode: e.exitCode, stdout: e.stdout }
  }
  step = 'commands background'
  const streamed = []
  const h = await sbx.commands.run('echo started; sleep 60; echo never', { background: true, onStdout: (d) => streamed.push(d) })
  for (let i = 0; i < 200 && !streamed.join('').includes('started'); i++) {
    await new Promise((r) => setTimeout(r, 100))
  }
  const seenBeforeKill = streamed.join('')
  step = 'commands list'
  const listed = (await sbx.commands.list()).map((p) => ({ pid: p.pid, cmd: p.cmd, args: p.args, cwd: p.cwd }))
  step = 'commands stdin'
  const rd = await sbx.commands.run('read a; read b; echo "got $a $b"', { background: true, stdin: true })
  await sbx.commands.sendStdin(rd.pid, 'one\n')
  await sbx.commands.sendStdin(rd.pid, 'two\n')
  const fed = await rd.wait()
  let lateStdin = null
  try {
    await sbx.commands.sendStdin(rd.pid, 'late\n')
  } catch (e) {
    lateStdin = e.constructor.name
  }
  step = 'commands kill'
  const killedCmd = await h.kill()
  let waitErr = null
  try {
    await h.wait()
  } catch (e) {
    waitErr = { name: e.constructor.name, exitCode: e.exitCode }
  }
  report.steps.commands = {
    stdout: cr.stdout, stderr: cr.stderr, exitCode: cr.exitCode, exitErr,
    pid: h.pid, seenBeforeKill, killed: killedCmd, waitErr,
    listed, fed: fed.stdout, lateStdin,
  }

  step = 'setTimeout'
  await sbx.setTimeout(120_000)

  step = 'getInfo'
  const info = await sbx.getInfo()
  report.steps.info = { metadata: info.metadata, state: info.state, templateId: info.templateId, endAfterStart: info.endAt > info.startedAt }

  step = 'list with metadata'
  const pager = Sandbox.list({ query: { metadata: { run } } })
  const items = await pager.nextItems()
  const other = await Sandbox.list({ query: { metadata: { run: run + '-none' } } }).nextItems()
  report.steps.list = { ids: items.map((i) => i.sandboxId), metadata: items.map((i) => i.metadata), none: other.length }

  step = 'connect from a second client'
  const again = await Sandbox.connect(sbx.sandboxId)
  ex = await again.runCode('x')
  report.steps.connect = { text: ex.text }

  step = 'kill'
  const killed = await sbx.kill()
  let afterKill = 'running'
  try {
    await Sandbox.getInfo(sbx.sandboxId)
  } catch (e) {
    afterKill = e.constructor.name
  }
  report.steps.kill = { killed: killed === undefined ? true : killed, afterKill }
}

main().then(
  () => { process.stdout.write(JSON.stringify(report) + '\n') },
  (err) => {
    report.failed = { step, error: String(err && err.stack || err) }
    process.stdout.write(JSON.stringify(report) + '\n')
    process.exitCode = 1
  },
)
