// Untrusted ids → single safe path components; joinUnder never lets a path escape its root.
import * as fs from 'fs';
import * as path from 'path';
import { joinUnder, safeComponent, MAX_COMPONENT_BYTES } from '../src/sanitize';
import { CaptureError } from '../src/errors';
import { cleanup, tmpDir } from './helpers';

afterAll(cleanup);

const NASTY = ['../', '..', '.', '', '/', '/etc/passwd', '..\\..\\x', 'a/../../b', 'nul\0byte', 'tab\tnew\nline', '\x7f', '.hidden', '%2E%2E', 'ok-id_1.2'];

describe('safeComponent', () => {
  test.each(NASTY)('%j becomes one component that stays inside its folder', (raw) => {
    const root = tmpDir('wavebus-san-');
    const c = safeComponent(raw, 'req_id');
    expect(c.length).toBeGreaterThan(0);
    expect(c).not.toMatch(/[/\\\0]/);
    // eslint-disable-next-line no-control-regex
    expect(c).not.toMatch(/[\x00-\x1f\x7f]/);
    expect(c === '.' || c === '..').toBe(false);
    expect(c.startsWith('.')).toBe(false);
    const p = path.join(root, c);
    expect(path.dirname(p)).toBe(root);
    fs.mkdirSync(p); // really creatable
    expect(fs.readdirSync(root)).toEqual([c]);
  });

  test('is injective on tricky inputs and keeps ordinary ids unchanged', () => {
    const outs = NASTY.map((s) => safeComponent(s, 'x'));
    expect(new Set(outs).size).toBe(NASTY.length);
    expect(safeComponent('chatcmpl-123_abc.4', 'req_id')).toBe('chatcmpl-123_abc.4');
    expect(safeComponent('a/b', 'x')).toBe('a%2Fb');
    expect(safeComponent('%2F', 'x')).toBe('%252F');
    expect(safeComponent('..', 'x')).toBe('%2E.');
    expect(safeComponent('', 'x')).toBe('%empty');
  });

  test('unicode is kept; lone surrogates are escaped', () => {
    expect(safeComponent('请求-ü-🚀', 'req_id')).toBe('请求-ü-🚀');
    expect(safeComponent('a\ud800b', 'x')).toBe('a%uD800b');
  });

  test('very long ids are bounded, distinct and stable', () => {
    const a = 'x'.repeat(500);
    const b = 'x'.repeat(499) + 'y';
    const ca = safeComponent(a, 'req_id');
    const cb = safeComponent(b, 'req_id');
    expect(Buffer.byteLength(ca)).toBeLessThanOrEqual(MAX_COMPONENT_BYTES);
    expect(ca).not.toBe(cb);
    expect(safeComponent(a, 'req_id')).toBe(ca);
    expect(ca).toMatch(/^x+~[0-9a-f]{16}$/);
    const u = safeComponent('🚀'.repeat(300), 'req_id');
    expect(Buffer.byteLength(u)).toBeLessThanOrEqual(MAX_COMPONENT_BYTES);
    expect(u).toMatch(/^(🚀)+~[0-9a-f]{16}$/); // cut on a character boundary
    const root = tmpDir('wavebus-san-long-');
    fs.mkdirSync(path.join(root, ca));
    fs.mkdirSync(path.join(root, u));
  });

  test('non-strings are refused naming the field', () => {
    expect(() => safeComponent(undefined as unknown as string, 'req_id')).toThrow(CaptureError);
    expect(() => safeComponent(5 as unknown as string, 'req_id')).toThrow(/req_id/);
  });
});

describe('joinUnder', () => {
  test('joins safe components', () => {
    expect(joinUnder('/r', 'a', 'b')).toBe('/r/a/b');
    expect(joinUnder('/r', safeComponent('../../etc', 'x'))).toBe('/r/%2E.%2F..%2Fetc');
  });
  test.each([['..'], ['../x'], ['/etc'], ['a', '../../b'], ['.'], ['a\0b']])('refuses %j', (...parts) => {
    expect(() => joinUnder('/r', ...parts)).toThrow(CaptureError);
  });
});
