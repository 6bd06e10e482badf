#!/usr/bin/env node
// Renders the files derived from proto/errors.json, the one list of error codes:
// docs/errors.md and clients/python/wavebus_client/error_codes.py. TypeScript imports the JSON
// directly; C++ is held to the list by test/error-codes.test.ts, which also checks these files
// are what render() gives. Usage: node scripts/gen-error-codes.js  (rewrites both files).
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..');
const LIST = path.join(root, 'proto', 'errors.json');

function load() {
  return JSON.parse(fs.readFileSync(LIST, 'utf8'));
}

function cell(s) {
  return String(s).replace(/\|/g, '\\|');
}

function renderDoc(list) {
  const lines = [
    '# Error codes',
    '',
    'Every error wavebus raises carries a stable `code` (`err.code` in TypeScript and in the',
    'native addon, `e.code` in Python). Branch on the code, never on the message: messages name',
    'the flag, field or file, and may change wording. The list below is the only list: it is',
    'generated from `proto/errors.json` by `node scripts/gen-error-codes.js`, and',
    '`test/error-codes.test.ts` fails when TypeScript, C++ or Python code uses a code that is not',
    'on it, when a listed code is used nowhere, or when this page is out of date.',
    '',
    'Adding a code: add it to `proto/errors.json` (meaning, who raises it, what the user does),',
    'run the script, commit the three files.',
    '',
    '| Code | Raised by | Meaning | What to do |',
    '| --- | --- | --- | --- |',
  ];
  for (const [code, e] of Object.entries(list.codes)) {
    lines.push(`| \`${code}\` | ${cell(e.raisedBy)} | ${cell(e.meaning)} | ${cell(e.action)} |`);
  }
  const f = list.errnoFamily;
  lines.push(
    '',
    '## System-call failures',
    '',
    `Codes matching \`${f.pattern}\` (raised by ${f.raisedBy}): ${f.meaning} ${f.action}`,
    '',
  );
  return lines.join('\n');
}

function renderPython(list) {
  const codes = Object.keys(list.codes);
  return [
    '"""The wavebus error codes (generated from proto/errors.json by scripts/gen-error-codes.js; do not edit).',
    '',
    'docs/errors.md explains each code. test/error-codes.test.ts checks this file is current."""',
    '',
    'CODES = frozenset({',
    ...codes.map((c) => `    "${c}",`),
    '})',
    '',
    '# System-call failures: ERR_ followed by the errno name.',
    `ERRNO_PATTERN = r"${list.errnoFamily.pattern}"`,
    '',
  ].join('\n');
}

/** Every derived file, relative to the package root, with the text it must hold. */
function render(list = load()) {
  return {
    'docs/errors.md': renderDoc(list),
    'clients/python/wavebus_client/error_codes.py': renderPython(list),
  };
}

module.exports = { render, load };

if (require.main === module) {
  for (const [rel, text] of Object.entries(render())) {
    fs.writeFileSync(path.join(root, rel), text);
    process.stdout.write(`wrote ${rel}\n`);
  }
}
