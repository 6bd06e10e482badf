// CURVE security for the wave bus: Z85 keys, key files, allow-lists and the socket options of
// CURVE servers and clients (the ZAP handler that admits only allow-listed keys: zap-handler.ts).
//
// File formats (docs/security.md):
//   NAME.pub  one Z85 public key (40 characters) on its own line; lines starting with "#" are comments.
//   NAME.key  JSON {"type":"wavebus-curve-keypair","public_key":Z85,"secret_key":Z85}, mode 0600.
//   allow-list file: one Z85 public key per line, optionally followed by whitespace and a label;
//     lines starting with "#" are comments. Or a directory: every *.pub in it.
import { createPrivateKey, createPublicKey } from 'crypto';
import * as fs from 'fs';
import * as path from 'path';
import { curveKeyPair } from 'zeromq';
import { ConfigError } from '../errors';
import { mkdirTrustedSync } from '../artifacts/safe-mkdir';

export const KEY_FILE_TYPE = 'wavebus-curve-keypair';
/** The ZAP endpoint libzmq asks (RFC 27); one handler per ZeroMQ context. */
export const ZAP_ENDPOINT = 'inproc://zeromq.zap.01';
export const ZAP_DOMAIN = 'wavebus';

const Z85_CHARS = '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';
const Z85_VALUE = new Map([...Z85_CHARS].map((c, i) => [c, i]));
const Z85_KEY = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

export interface CurveKeyPair {
  publicKey: string;
  secretKey: string;
}

/** What a CURVE client (agent, launcher, tool) needs: the server's public key and its own pair. */
export interface CurveClientKeys {
  serverPublicKey: string;
  publicKey: string;
  secretKey: string;
}

/** Allowed client public keys (Z85) → a label for logs (file name or the allow-list's label). */
export type AllowList = Map<string, string>;

/** What a CURVE server (the coordinator) needs: its key pair and the client allow-list. */
export interface CurveServerKeys {
  keyPair: CurveKeyPair;
  allow: AllowList;
}

// ------------------------------------------------------------------ Z85

export function z85Encode(bytes: Uint8Array): string {
  if (bytes.length % 4 !== 0) throw new RangeError(`Z85 encodes multiples of 4 bytes, got ${bytes.length}`);
  let out = '';
  const view = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length);
  for (let i = 0; i < view.length; i += 4) {
    let v = view.readUInt32BE(i);
    let chunk = '';
    for (let j = 0; j < 5; j++) {
      chunk = Z85_CHARS[v % 85] + chunk;
      v = Math.floor(v / 85);
    }
    out += chunk;
  }
  return out;
}

/** Decode Z85; undefined when the text is not Z85 (bad length, character or value). */
export function z85Decode(text: string): Buffer | undefined {
  if (text.length % 5 !== 0) return undefined;
  const out = Buffer.alloc((text.length / 5) * 4);
  for (let i = 0; i < text.length; i += 5) {
    let v = 0;
    for (let j = 0; j < 5; j++) {
      const d = Z85_VALUE.get(text[i + j]);
      if (d === undefined) return undefined;
      v = v * 85 + d;
    }
    if (v > 0xffffffff) return undefined;
    out.writeUInt32BE(v, (i / 5) * 4);
  }
  return out;
}

export function isZ85Key(s: string): boolean {
  return Z85_KEY.test(s) && z85Decode(s) !== undefined;
}

/** The Curve25519 public key of a Z85 secret key (Node's X25519; used to check key files). */
export function publicKeyOf(secretKeyZ85: string): string {
  const d = z85Decode(secretKeyZ85);
  if (!d || d.length !== 32) throw new ConfigError('not a 40-character Z85 CURVE secret key');
  const priv = createPrivateKey({ key: { kty: 'OKP', crv: 'X25519', d: d.toString('base64url'), x: '' }, format: 'jwk' });
  const x = createPublicKey(priv).export({ format: 'jwk' }).x as string;
  return z85Encode(Buffer.from(x, 'base64url'));
}

export function newKeyPair(): CurveKeyPair {
  return curveKeyPair();
}

// ------------------------------------------------------------------ key files

function readKeyFile(file: string, flag: string): string {
  let st: fs.Stats;
  try {
    st = fs.statSync(file);
  } catch (e) {
    throw new ConfigError(`${flag} ${file}: cannot read the key file: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, 'ERR_KEY_FILE');
  }
  if (!st.isFile()) throw new ConfigError(`${flag} ${file}: not a regular file`, 'ERR_KEY_FILE');
  if (st.size > 64 * 1024) throw new ConfigError(`${flag} ${file}: ${st.size} bytes is too large for a key file`, 'ERR_KEY_FILE');
  try {
    return fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new ConfigError(`${flag} ${file}: cannot read the key file: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, 'ERR_KEY_FILE');
  }
}

function badKey(flag: string, where: string, what: string, value: unknown): ConfigError {
  const shown = typeof value === 'string' ? `${value.length} characters` : JSON.stringify(value);
  return new ConfigError(`${flag} ${where}: ${what} is not a 40-character Z85 CURVE key (got ${shown})`, 'ERR_KEY_FILE');
}

/**
 * Load a NAME.key file. The secret key must be private: a file that group or others may read
 * is refused (like ssh), since anyone holding it can join the bus as that peer.
 */
export function loadKeyPair(file: string, flag: string): CurveKeyPair {
  const text = readKeyFile(file, flag);
  const mode = fs.statSync(file).mode & 0o777;
  if (process.platform !== 'win32' && (mode & 0o077) !== 0) {
    throw new ConfigError(
      `${flag} ${file}: permissions 0${mode.toString(8)} are too open for a secret key (group or others can read it); run chmod 600 ${file}`,
      'ERR_KEY_PERMISSIONS',
    );
  }
  let doc: any;
  try {
    doc = JSON.parse(text);
  } catch {
    const hint = isZ85Key(text.trim().split('\n').filter((l) => !l.startsWith('#'))[0]?.trim() ?? '') ? ' (this looks like a .pub file; pass the .key file)' : '';
    throw new ConfigError(`${flag} ${file}: not a wavebus key file (expected JSON {"type":"${KEY_FILE_TYPE}","public_key":...,"secret_key":...})${hint}`, 'ERR_KEY_FILE');
  }
  if (doc === null || typeof doc !== 'object' || doc.type !== KEY_FILE_TYPE) {
    throw new ConfigError(`${flag} ${file}: not a wavebus key file ("type" must be "${KEY_FILE_TYPE}")`, 'ERR_KEY_FILE');
  }
  if (typeof doc.public_key !== 'string' || !isZ85Key(doc.public_key)) throw badKey(flag, file, 'public_key', doc.public_key);
  if (typeof doc.secret_key !== 'string' || !isZ85Key(doc.secret_key)) throw badKey(flag, file, 'secret_key', doc.secret_key);
  if (publicKeyOf(doc.secret_key) !== doc.public_key) {
    throw new ConfigError(`${flag} ${file}: public_key does not belong to secret_key (the file was edited or mixed up)`, 'ERR_KEY_FILE');
  }
  return { publicKey: doc.public_key, secretKey: doc.secret_key };
}

/** Key lines of a .pub or allow-list text: [line number, key, label]. Comments and blanks skipped. */
function keyLines(text: string, flag: string, file: string): Array<[number, string, string]> {
  const out: Array<[number, string, string]> = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === '') return;
    // A Z85 key never starts with '#' (the first digit of a group is at most '%'), but may hold
    // one inside: so only a line that starts with '#' is a comment.
    if (line.startsWith('#')) return;
    const [first, ...rest] = line.split(/\s+/);
    if (isZ85Key(first)) {
      out.push([i + 1, first, rest.join(' ').replace(/^#\s*/, '')]);
      return;
    }
    throw new ConfigError(`${flag} ${file}:${i + 1}: expected a 40-character Z85 CURVE public key, got ${JSON.stringify(first.slice(0, 60))}`, 'ERR_KEY_FILE');
  });
  return out;
}

/** A JSON document (a .key file), not a key line: Z85 has '{' in its alphabet, so a key may start with one. */
function isJsonObject(text: string): boolean {
  if (!text.trimStart().startsWith('{')) return false;
  try {
    const doc: unknown = JSON.parse(text);
    return typeof doc === 'object' && doc !== null;
  } catch {
    return false;
  }
}

/** Load a NAME.pub file: exactly one Z85 public key. */
export function loadPublicKey(file: string, flag: string): string {
  const text = readKeyFile(file, flag);
  if (isJsonObject(text)) {
    throw new ConfigError(`${flag} ${file}: this is a secret .key file; pass the public .pub file (never copy a .key to other hosts)`, 'ERR_KEY_FILE');
  }
  const keys = keyLines(text, flag, file);
  if (keys.length !== 1) throw new ConfigError(`${flag} ${file}: expected exactly one public key, found ${keys.length}`, 'ERR_KEY_FILE');
  return keys[0][1];
}

/** Load an allow-list: a file of keys (one per line) or a directory of *.pub files. Never empty. */
export function loadAllowList(fileOrDir: string, flag: string): AllowList {
  let st: fs.Stats;
  try {
    st = fs.statSync(fileOrDir);
  } catch (e) {
    throw new ConfigError(`${flag} ${fileOrDir}: cannot read the allow-list: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`, 'ERR_KEY_FILE');
  }
  const allow: AllowList = new Map();
  if (st.isDirectory()) {
    const pubs = fs.readdirSync(fileOrDir).filter((f) => f.endsWith('.pub')).sort();
    for (const f of pubs) allow.set(loadPublicKey(path.join(fileOrDir, f), flag), f.slice(0, -'.pub'.length));
  } else {
    for (const [line, key, label] of keyLines(readKeyFile(fileOrDir, flag), flag, fileOrDir)) {
      allow.set(key, label || `${path.basename(fileOrDir)}:${line}`);
    }
  }
  if (allow.size === 0) {
    throw new ConfigError(`${flag} ${fileOrDir}: the allow-list holds no public key, so no agent could connect`, 'ERR_KEY_FILE');
  }
  return allow;
}

/** Server keys from the coordinator's flags; both flags or neither. */
export function loadServerKeys(secretKeyFile: string | undefined, allowPath: string | undefined): CurveServerKeys | undefined {
  if (!secretKeyFile && !allowPath) return undefined;
  if (!secretKeyFile) throw new ConfigError('--curve-allow needs --curve-secret-key FILE (the coordinator key pair)');
  if (!allowPath) throw new ConfigError('--curve-secret-key needs --curve-allow FILE|DIR (the client public keys to admit)');
  return { keyPair: loadKeyPair(secretKeyFile, '--curve-secret-key'), allow: loadAllowList(allowPath, '--curve-allow') };
}

/** Client keys from an agent's (or tool's) flags; both flags or neither. */
export function loadClientKeys(
  serverKeyFile: string | undefined,
  keyFile: string | undefined,
  flags = { serverKey: '--curve-server-key', key: '--curve-key' },
): CurveClientKeys | undefined {
  if (!serverKeyFile && !keyFile) return undefined;
  if (!serverKeyFile) throw new ConfigError(`${flags.key} needs ${flags.serverKey} FILE (the coordinator's .pub)`);
  if (!keyFile) throw new ConfigError(`${flags.serverKey} needs ${flags.key} FILE (this peer's own .key)`);
  const serverPublicKey = loadPublicKey(serverKeyFile, flags.serverKey);
  const own = loadKeyPair(keyFile, flags.key);
  return { serverPublicKey, publicKey: own.publicKey, secretKey: own.secretKey };
}

// ------------------------------------------------------------------ writing keys

/** Write NAME.key (0600) and NAME.pub into dir; refuses to overwrite either. */
export function writeKeyPair(dir: string, name: string, pair: CurveKeyPair = newKeyPair()): { keyFile: string; pubFile: string; publicKey: string } {
  if (!/^[A-Za-z0-9_][A-Za-z0-9._-]*$/.test(name)) {
    throw new ConfigError(`--name ${JSON.stringify(name)}: use letters, digits, '.', '_' and '-' (not starting with '.' or '-')`);
  }
  mkdirTrustedSync(dir, 0o700, '--out');
  const keyFile = path.join(dir, `${name}.key`);
  const pubFile = path.join(dir, `${name}.pub`);
  for (const f of [keyFile, pubFile]) {
    if (fs.existsSync(f)) throw new ConfigError(`--out ${dir}: ${f} already exists; refusing to overwrite a key (remove it first, or pick another --name)`, 'ERR_KEY_EXISTS');
  }
  const doc = { type: KEY_FILE_TYPE, name, public_key: pair.publicKey, secret_key: pair.secretKey };
  // 'wx': fail rather than clobber if the file appeared meanwhile; mode applies at creation.
  fs.writeFileSync(keyFile, `${JSON.stringify(doc)}\n`, { flag: 'wx', mode: 0o600 });
  fs.chmodSync(keyFile, 0o600); // the umask may have taken bits away, never added; be exact anyway
  try {
    fs.writeFileSync(pubFile, `# wavebus CURVE public key: ${name}\n${pair.publicKey}\n`, { flag: 'wx', mode: 0o644 });
  } catch (e) {
    fs.rmSync(keyFile, { force: true });
    throw e;
  }
  return { keyFile, pubFile, publicKey: pair.publicKey };
}

/** An allow-list text made of every *.pub in dir (`KEY name` lines). */
export function allowListText(dir: string, flag = '--allow-list'): string {
  const allow = loadAllowList(dir, flag);
  return [...allow.entries()].map(([k, label]) => `${k} ${label}`).join('\n') + '\n';
}

// ------------------------------------------------------------------ socket options

/** Options of a CURVE server socket: ZAP is asked for every client, and must be present. */
export function serverSocketOptions(keys: CurveServerKeys | undefined): Record<string, unknown> {
  if (!keys) return {};
  return {
    curveServer: true,
    curveSecretKey: keys.keyPair.secretKey,
    curvePublicKey: keys.keyPair.publicKey,
    zapDomain: ZAP_DOMAIN,
    // Without a ZAP handler libzmq would admit any client that knows the server key; refuse instead.
    zapEnforceDomain: true,
  };
}

/** Options of a CURVE client socket (SUB, DEALER). */
export function clientSocketOptions(keys: CurveClientKeys | undefined): Record<string, unknown> {
  if (!keys) return {};
  return { curveServerKey: keys.serverPublicKey, curvePublicKey: keys.publicKey, curveSecretKey: keys.secretKey };
}

// ------------------------------------------------------------------ a key directory (wavebus launch --curve-dir)

/**
 * The files `wavebus launch --curve-dir DIR` uses: coordinator.key (node 0 only), coordinator.pub,
 * agent.key (agents and the launcher's readiness polling), and the allow-list: DIR/allowed (a
 * file or a directory of *.pub) when present, else agent.pub.
 */
export function curveDirFiles(dir: string): { serverKey: string; serverPub: string; clientKey: string; allow: string } {
  const allowed = path.join(dir, 'allowed');
  return {
    serverKey: path.join(dir, 'coordinator.key'),
    serverPub: path.join(dir, 'coordinator.pub'),
    clientKey: path.join(dir, 'agent.key'),
    allow: fs.existsSync(allowed) ? allowed : path.join(dir, 'agent.pub'),
  };
}

/** Client keys from a --curve-dir; errors name --curve-dir and the file. */
export function loadCurveDirClient(dir: string): CurveClientKeys {
  const f = curveDirFiles(dir);
  return loadClientKeys(f.serverPub, f.clientKey, { serverKey: '--curve-dir', key: '--curve-dir' })!;
}

/** Server keys from a --curve-dir (checked by the launcher before it starts the coordinator). */
export function loadCurveDirServer(dir: string): CurveServerKeys {
  const f = curveDirFiles(dir);
  return { keyPair: loadKeyPair(f.serverKey, '--curve-dir'), allow: loadAllowList(f.allow, '--curve-dir') };
}
