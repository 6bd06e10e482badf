// The one list of error codes (proto/errors.json): every ERR_ code that TypeScript, C++ or
// Python source raises or compares must be on it, every listed code must be used somewhere,
// and the files generated from it (docs/errors.md, the Python error_codes.py) must be current.
import * as fs from 'fs';
import * as path from 'path';
import { ERROR_CODES, isErrorCode, WavebusError, ConfigError } from '../src/errors';
import { runPython } from './helpers';

// eslint-disable-next-line @typescript-eslint/no-var-requires
const gen = require('../scripts/gen-error-codes.js') as { render(list?: unknown): Record<string, string>; load(): any };

const ROOT = path.resolve(__dirname, '..');
const SCANNED = [
  { dir: 'src', ext: /\.ts$/ },
  { dir: 'native', ext: /\.(cc|h)$/ },
  { dir: 'clients/python', ext: /\.py$/, skip: /(wavebus_pb2|error_codes)\.py$/ },
];
// ERR_ followed by at least one capital or digit: a template prefix (`ERR_${errno}`) is not a code.
const CODE = /\bERR_[A-Z0-9][A-Z0-9_]*\b/g;

function filesUnder(dir: string, ext: RegExp, skip?: RegExp): string[] {
  const out: string[] = [];
  for (const ent of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, ent.name);
    if (ent.isDirectory()) {
      if (ent.name !== '__pycache__' && ent.name !== 'build') out.push(...filesUnder(p, ext, skip));
    } else if (ext.test(ent.name) && !(skip && skip.test(p))) {
      out.push(p);
    }
  }
  return out;
}

/** code -> the files (relative) that mention it. */
function usedCodes(): Map<string, string[]> {
  const used = new Map<string, string[]>();
  for (const { dir, ext, skip } of SCANNED) {
    for (const f of filesUnder(path.join(ROOT, dir), ext, skip)) {
      for (const m of fs.readFileSync(f, 'utf8').matchAll(CODE)) {
        const rel = path.relative(ROOT, f);
        const seen = used.get(m[0]) ?? [];
        if (!seen.includes(rel)) seen.push(rel);
        used.set(m[0], seen);
      }
    }
  }
  return used;
}

describe('error codes: one list for TypeScript, C++ and Python', () => {
  const used = usedCodes();

  test('every code used in src/, native/ and clients/python/ is on proto/errors.json', () => {
    const unlisted = [...used].filter(([code]) => !isErrorCode(code)).map(([code, files]) => `${code} (${files.join(', ')})`);
    expect(unlisted).toEqual([]);
    // The scan sees all three languages: a change that stops scanning one of them fails here.
    const langs = new Set([...used.values()].flat().map((f) => path.extname(f)));
    expect([...langs].sort()).toEqual(expect.arrayContaining(['.cc', '.py', '.ts']));
  });

  test('every listed code is used somewhere', () => {
    const unused = Object.keys(ERROR_CODES).filter((c) => !used.has(c));
    expect(unused).toEqual([]);
  });

  test('every listed code has a meaning, who raises it and what the user does', () => {
    for (const [code, info] of Object.entries(ERROR_CODES)) {
      expect(code).toMatch(/^ERR_[A-Z0-9_]+$/);
      for (const field of ['raisedBy', 'meaning', 'action'] as const) {
        expect({ code, field, ok: typeof info[field] === 'string' && info[field].trim().length > 0 }).toEqual({ code, field, ok: true });
      }
    }
  });

  test('docs/errors.md and the Python error_codes.py are what proto/errors.json gives', () => {
    for (const [rel, text] of Object.entries(gen.render())) {
      expect({ rel, current: fs.readFileSync(path.join(ROOT, rel), 'utf8') === text }).toEqual({ rel, current: true });
    }
    const doc = fs.readFileSync(path.join(ROOT, 'docs/errors.md'), 'utf8');
    for (const code of Object.keys(ERROR_CODES)) expect(doc).toContain(`\`${code}\``);
  });

  test('the scan catches an unlisted code and the renderer a missing doc entry', () => {
    expect(isErrorCode('ERR_NOT_ON_THE_LIST_AT_ALL')).toBe(false);
    expect(isErrorCode('ERR_ENOSPC')).toBe(true);
    const list = gen.load();
    delete list.codes.ERR_CONFIG;
    expect(gen.render(list)['docs/errors.md']).not.toContain('`ERR_CONFIG`');
  });

  test('TypeScript classes default to listed codes', () => {
    expect(isErrorCode(new ConfigError('x').code)).toBe(true);
    expect(new WavebusError('ERR_TIMEOUT', 'x').code).toBe('ERR_TIMEOUT');
  });

  test('Python reads the same list', () => {
    const out = runPython(
      'import sys, json; sys.path.insert(0, sys.argv[1]); import wavebus_client.errors as e; ' +
        'print(json.dumps({"codes": sorted(e.CODES), "enospc": e.is_error_code("ERR_ENOSPC"), "bogus": e.is_error_code("ERR_BOGUS_X"), ' +
        '"defaults": sorted(c.default_code for c in [e.WavebusError, e.ConfigError, e.ProtocolError, e.AgentUnavailableError, e.AgentError, e.CaptureError, e.CudaUnavailableError, e.ReplayError])}))',
      [path.join(ROOT, 'clients/python')],
    );
    const py = JSON.parse(out);
    expect(py.codes).toEqual(Object.keys(ERROR_CODES).sort());
    expect(py.enospc).toBe(true);
    expect(py.bogus).toBe(false);
    for (const d of py.defaults) expect(ERROR_CODES[d]).toBeDefined();
  });
});
