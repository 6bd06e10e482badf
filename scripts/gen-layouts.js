#!/usr/bin/env node
// Renders clients/python/wavebus_client/shm_layouts_data.py from proto/layouts.json, the one
// description of the shared-memory layouts (docs/layouts.md): the Python package carries the data
// (an installed client has no proto/ beside it); TypeScript imports the JSON directly.
// test/layouts.test.ts checks the file is what render() gives. Usage: node scripts/gen-layouts.js
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const SOURCE = path.join(root, 'proto', 'layouts.json');
const PYTHON = path.join(root, 'clients', 'python', 'wavebus_client', 'shm_layouts_data.py');

function render() {
  const layouts = JSON.parse(fs.readFileSync(SOURCE, 'utf8')).layouts;
  const text = JSON.stringify(layouts, null, 2);
  if (text.includes("'''")) throw new Error("proto/layouts.json: a description may not hold '''");
  return [
    '"""The shared-memory layouts (generated from proto/layouts.json by scripts/gen-layouts.js; do not edit).',
    '',
    'shm_layout.py checks and serves them; test/layouts.test.ts checks this file is current."""',
    'import json',
    '',
    "LAYOUTS = json.loads(r'''",
    text,
    "''')",
    '',
  ].join('\n');
}

if (require.main === module) fs.writeFileSync(PYTHON, render());
module.exports = { render, PYTHON };
