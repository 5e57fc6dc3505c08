'use strict';
// Prints what this image's node can load, as JSON, for the runtime's package
// list (GET /v1/runtimes). Run by deploy/images/build.sh inside the finished
// root filesystem. Node's built-in modules come first (version: node's), then
// any package installed where node looks for global modules.
const fs = require('fs');
const Module = require('module');
const path = require('path');

const packages = Module.builtinModules
  .filter((m) => !m.startsWith('_') && !m.includes('/'))
  .map((m) => ({ name: 'node:' + m, version: process.versions.node, modules: [m] }));
for (const dir of Module.globalPaths) {
  let names = [];
  try {
    names = fs.readdirSync(dir);
  } catch {
    continue;
  }
  for (const n of names) {
    try {
      const pkg = JSON.parse(fs.readFileSync(path.join(dir, n, 'package.json'), 'utf8'));
      if (pkg.name) packages.push({ name: pkg.name, version: String(pkg.version || ''), modules: [pkg.name] });
    } catch {
      // not a package
    }
  }
}
process.stdout.write(JSON.stringify({ language: 'javascript', version: process.versions.node, packages }));
