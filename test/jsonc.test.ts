import { lineColumn, MAX_JSONC_DEPTH, parseJsonc, stripJsonc } from '../src/guard/jsonc';
import { ConfigError, JsoncError } from '../src/errors';

function errorOf(fn: () => unknown): JsoncError {
  try {
    fn();
  } catch (e) {
    return e as JsoncError;
  }
  throw new Error('expected an error');
}

describe('JSONC', () => {
  test('comments outside strings are dropped, comment-like text inside strings is kept', () => {
    const text = `{
      // a line comment
      "url": "http://host//path", /* block */ "glob": "a/*b*/c",
      "quote": "say \\"// hi\\"", // trailing
      /* multi
         line */ "n": 3
    }`;
    expect(parseJsonc(text, 'x.json')).toEqual({ url: 'http://host//path', glob: 'a/*b*/c', quote: 'say "// hi"', n: 3 });
  });

  test('trailing commas before } and ] are dropped, also with comments between', () => {
    const v = parseJsonc('{"a": [1, 2, 3,], "b": {"c": true, /* x */ }, // y\n}', 'x.json');
    expect(v).toEqual({ a: [1, 2, 3], b: { c: true } });
  });

  test('a comma inside a string before } is not touched', () => {
    expect(parseJsonc('{"a": ",}"}', 'x.json')).toEqual({ a: ',}' });
  });

  test('stripping keeps length and newlines, so positions map 1:1', () => {
    const text = '{ /* c\n */ "a": 1, // z\n}';
    const s = stripJsonc(text);
    expect(s.length).toBe(text.length);
    expect(s.split('\n').length).toBe(text.split('\n').length);
  });

  test('errors name the source and the line:column of the original text', () => {
    const text = ['{', '  // comment: "quoted" /* not closed', '  "detector": {', '    "token_repeat": { "enabled": tru }', '  }', '}'].join('\n');
    const e = errorOf(() => parseJsonc(text, 'runtime_config.json'));
    expect(e).toBeInstanceOf(JsoncError);
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.line).toBe(4);
    expect(e.column).toBe(34);
    expect(e.message).toBe('runtime_config.json:4:34: Unexpected token "t"');
  });

  test('a missing comma after a block comment reports the position after it', () => {
    const e = errorOf(() => parseJsonc('{"a": 1 /* c */ "b": 2}', 'f.json'));
    expect([e.line, e.column]).toEqual([1, 17]);
    expect(e.message).toMatch(/expected ',' or '}'/);
  });

  test('unterminated string, unexpected end, garbage after the value', () => {
    expect(errorOf(() => parseJsonc('{"a": "b', 'f')).message).toBe('f:1:7: Unterminated string');
    expect(errorOf(() => parseJsonc('{"a": 1,\n', 'f')).message).toMatch(/^f:2:1: Unexpected end of input/);
    expect(errorOf(() => parseJsonc('{} x', 'f')).message).toMatch(/^f:1:4: .*after the end/);
    expect(errorOf(() => parseJsonc('', 'f')).message).toBe('f:1:1: Unexpected end of input');
  });

  test('the root must be an object', () => {
    expect(errorOf(() => parseJsonc('  [1, 2]', 'f')).message).toBe('f:1:3: the root must be a JSON object, got an array');
    expect(errorOf(() => parseJsonc('// c\n3', 'f')).message).toBe('f:2:1: the root must be a JSON object, got number');
  });

  test('numbers, escapes, nested values parse like JSON.parse', () => {
    const src = '{"a": -1.5e3, "b": "\\u00e9\\n", "c": [null, false, {"d": 0}], "__proto__": 1}';
    const v = parseJsonc(src, 'f');
    expect(v.a).toBe(-1500);
    expect(v.b).toBe('é\n');
    expect(v.c).toEqual([null, false, { d: 0 }]);
    expect(Object.keys(v)).toContain('__proto__');
    expect(errorOf(() => parseJsonc('{"a": 01}', 'f')).message).toMatch(/^f:1:8:/);
  });

  test('lineColumn', () => {
    expect(lineColumn('ab\ncd', 0)).toEqual({ line: 1, column: 1 });
    expect(lineColumn('ab\ncd', 4)).toEqual({ line: 2, column: 2 });
  });
});

describe('JSONC nesting limit', () => {
  test('nesting beyond MAX_JSONC_DEPTH is an error at the offending bracket, not a stack overflow', () => {
    const deep = `{\n "a": ${'['.repeat(100000)}1${']'.repeat(100000)}\n}`;
    const e = errorOf(() => parseJsonc(deep, 'deep.json'));
    expect(e).toBeInstanceOf(JsoncError);
    expect(e.message).toBe(`deep.json:2:${7 + MAX_JSONC_DEPTH - 1}: nesting deeper than ${MAX_JSONC_DEPTH} levels (MAX_JSONC_DEPTH)`);
    const objs = `${'{"k":'.repeat(5000)}1${'}'.repeat(5000)}`;
    expect(errorOf(() => parseJsonc(objs, 'o.json')).message).toMatch(/^o\.json:1:\d+: nesting deeper than/);
    // The limit itself is accepted.
    const ok = `{"a": ${'['.repeat(MAX_JSONC_DEPTH - 1)}${']'.repeat(MAX_JSONC_DEPTH - 1)}}`;
    expect(() => parseJsonc(ok, 'ok.json')).not.toThrow();
  });
});
