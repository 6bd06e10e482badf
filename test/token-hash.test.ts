// report.save_sensitive_info "hashed" (docs/fingerprints.md): a keyed hash per token id, the key a
// local 0600 file never written into a report. The end-to-end case (a torch job's report hashed with
// the key file given) is in fingerprints.test.ts; here the key file's checks and the config value.
import * as fs from 'fs';
import * as path from 'path';
import { TokenHasher, createTokenHashKeyFile } from '../src/guard/token-hash';
import { checkConfigPartial, configFromRaw } from '../src/guard/config';
import { cleanup, tmpDir } from './helpers';

afterAll(cleanup);

test('same key, same hashes: two captures compare; another key hashes differently; the key id tells them apart', () => {
  const dir = tmpDir('wavebus-hash-');
  const file = createTokenHashKeyFile(dir);
  expect((fs.statSync(file).mode & 0o777).toString(8)).toBe('600');
  const a = TokenHasher.load(file, '--token-hash-key-file');
  const b = TokenHasher.fromFlags(undefined, { WAVEBUS_TOKEN_HASH_KEY_FILE: file });
  expect(a.hashAll([1, 2, 3])).toEqual(b.hashAll([1, 2, 3]));
  expect(a.hash(1)).toMatch(/^[0-9a-f]{16}$/);
  expect(a.hash(1)).not.toBe(a.hash(2));
  expect(a.scheme).toEqual(b.scheme);
  const other = TokenHasher.ephemeral();
  expect(other.hash(1)).not.toBe(a.hash(1));
  expect(other.scheme.key_id).not.toBe(a.scheme.key_id);
  expect(other.scheme.key_source).toBe('ephemeral');
  expect(JSON.stringify(a.scheme)).not.toContain(fs.readFileSync(file, 'utf8').trim());
});

test('a key file that is a link, readable by others, or not 64 hex digits is refused, naming the flag and the file', () => {
  const dir = tmpDir('wavebus-hash-');
  const good = createTokenHashKeyFile(dir);
  const link = path.join(dir, 'link.key');
  fs.symlinkSync(good, link);
  expect(() => TokenHasher.load(link, '--token-hash-key-file')).toThrow(/--token-hash-key-file .*link\.key: is a symbolic link/);
  const open = path.join(dir, 'open.key');
  fs.writeFileSync(open, 'ab'.repeat(32), { mode: 0o644 });
  fs.chmodSync(open, 0o644);
  expect(() => TokenHasher.load(open, '--token-hash-key-file')).toThrow(/permissions 0644 are too open for the token hash key/);
  const junk = path.join(dir, 'junk.key');
  fs.writeFileSync(junk, 'not hex at all', { mode: 0o600 });
  expect(() => TokenHasher.fromFlags(undefined, { WAVEBUS_TOKEN_HASH_KEY_FILE: junk })).toThrow(/WAVEBUS_TOKEN_HASH_KEY_FILE .*junk\.key: expected 64 lowercase hex digits/);
});

test('report.save_sensitive_info takes true, false or "hashed"; anything else is refused naming the key', () => {
  expect(configFromRaw({ report: { save_sensitive_info: 'hashed' } }, 'test').report.save_sensitive_info).toBe('hashed');
  expect(configFromRaw({ report: { save_sensitive_info: true } }, 'test').report.save_sensitive_info).toBe(true);
  expect(configFromRaw({}, 'test').report.save_sensitive_info).toBe(false);
  expect(() => checkConfigPartial({ report: { save_sensitive_info: 'yes' } }, 'runtime_config.json')).toThrow('runtime_config.json: report.save_sensitive_info: expected a boolean or "hashed", got "yes"');
});
