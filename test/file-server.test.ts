// The agent's file server against a hostile local user who can write into a served dump
// directory (a shared dump root, or a subdirectory they own): links, linked directories and
// fifos they plant must not let the (root) agent read, list or hang on anything outside the root.
// The attacker is a real second uid; the agent side is a real FileServer on real files.
import * as fs from 'fs';
import * as path from 'path';
import { FileServer, listBundleFiles } from '../src/agent/file-server';
import type { CoordinatorMsg } from '../src/bus/frames';
import { payloadOf } from '../src/bus/payload';
import { crc32c, formatChecksum } from '../src/artifacts/checksum';
import { createLogger } from '../src/log';
import { cleanup, cleanupUsers, describeAsRoot, otherUser, runAs, tmpDir, type OtherUser } from './helpers';

const quiet = createLogger('file-server-test', 'silent');
const SECRET = 'root-only secret: never served\n';

interface Fixture {
  base: string;
  root: string;
  secretFile: string;
  secretDir: string;
  server: FileServer;
  attacker: OtherUser;
}

let seq = 0;
function listReq(prefix: string): CoordinatorMsg {
  return { epoch: 1, requestId: ++seq, body: 'fileList', fileList: { root: 'dumps', prefix } } as unknown as CoordinatorMsg;
}
function chunkReq(rel: string, offset = 0, length = 1 << 20): CoordinatorMsg {
  return { epoch: 1, requestId: ++seq, body: 'fileChunk', fileChunk: { root: 'dumps', path: rel, offset, length, received: [] } } as unknown as CoordinatorMsg;
}

/** The attacker runs `cmd args` as their own uid; it must succeed (they own the directory they plant in). */
function plant(u: OtherUser, cmd: string, args: string[]): void {
  const r = runAs(u, cmd, args);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} as ${u.name} failed: ${r.stderr}`);
}

function fixture(): Fixture {
  const attacker = otherUser('fsrv');
  const base = tmpDir('wavebus-fsrv-');
  fs.chmodSync(base, 0o711); // the attacker may pass through, not list or read
  // Outside the root: a root-only file and a root-only directory with one.
  const secretFile = path.join(base, 'secret.txt');
  fs.writeFileSync(secretFile, SECRET, { mode: 0o600 });
  const secretDir = path.join(base, 'private');
  fs.mkdirSync(secretDir, { mode: 0o700 });
  fs.writeFileSync(path.join(secretDir, 'key.txt'), SECRET, { mode: 0o600 });
  // The served root holds a finished bundle and a directory the attacker owns (a shared dump root).
  const root = path.join(base, 'dumps');
  fs.mkdirSync(path.join(root, 'bundle'), { recursive: true, mode: 0o755 });
  fs.chmodSync(root, 0o755);
  fs.writeFileSync(path.join(root, 'bundle', 'layer0.k.npy'), 'real tensor bytes');
  fs.mkdirSync(path.join(root, 'shared'), { mode: 0o755 });
  fs.chownSync(path.join(root, 'shared'), attacker.uid, attacker.gid);
  // Sanity: the attacker cannot read the secret directly.
  expect(runAs(attacker, 'cat', [secretFile]).code).not.toBe(0);
  const server = new FileServer(0, () => ({ dumps: root }), quiet);
  return { base, root, secretFile, secretDir, server, attacker };
}

describeAsRoot('file server refuses links and special files planted by another uid', () => {
  afterAll(async () => {
    await cleanup();
    cleanupUsers();
  });

  test('a link to a file outside the root: the chunk request is refused and nothing is listed', async () => {
    const f = fixture();
    plant(f.attacker, 'ln', ['-s', f.secretFile, path.join(f.root, 'shared', 'leak.npy')]);
    const reply = await f.server.handle(chunkReq('shared/leak.npy'));
    const c = reply.fileChunk as { error?: string };
    expect(payloadOf(reply)).toBeUndefined();
    expect(c.error).toMatch(/symbolic link/);
    expect(JSON.stringify(reply)).not.toContain('secret');
    const list = (await f.server.handle(listReq(''))).fileList as { files: { path: string }[]; error?: string };
    expect(list.error).toBeUndefined();
    expect(list.files.map((x) => x.path)).toEqual(['bundle/layer0.k.npy']);
  });

  test('a linked directory inside the root: neither a chunk through it nor a listing under it reaches outside', async () => {
    const f = fixture();
    plant(f.attacker, 'ln', ['-s', f.secretDir, path.join(f.root, 'shared', 'dir')]);
    const reply = await f.server.handle(chunkReq('shared/dir/key.txt'));
    expect(payloadOf(reply)).toBeUndefined();
    expect((reply.fileChunk as { error?: string }).error).toMatch(/symbolic link/);
    // Listing with the link as the prefix (the old code stat()ed the prefix and walked into it).
    for (const prefix of ['shared/dir', 'shared/dir/', 'shared']) {
      const list = (await f.server.handle(listReq(prefix))).fileList as { files: { path: string; checksum: string }[]; error?: string };
      expect(list.files.map((x) => x.path)).toEqual([]);
      if (prefix !== 'shared') expect(list.error).toMatch(/symbolic link/);
    }
    // The whole root lists only the real bundle: the link is neither listed nor walked into.
    const whole = listBundleFiles(f.root, '');
    expect(whole.map((x) => x.path)).toEqual(['bundle/layer0.k.npy']);
  });

  test('a fifo in the root is refused at once (the old open blocked for a writer) and not listed', async () => {
    const f = fixture();
    plant(f.attacker, 'mkfifo', [path.join(f.root, 'shared', 'pipe.npy')]);
    const t0 = Date.now();
    const reply = await f.server.handle(chunkReq('shared/pipe.npy'));
    expect((reply.fileChunk as { error?: string }).error).toMatch(/fifo, not a regular file/);
    expect(Date.now() - t0).toBeLessThan(20000); // bounded, not a speed claim: the old code never returned
    const list = (await f.server.handle(listReq('shared'))).fileList as { files: unknown[] };
    expect(list.files).toEqual([]);
  });

  test('a linked dump.json does not feed checksums read from outside the root into the listing', async () => {
    const f = fixture();
    const forged = path.join(f.base, 'forged.json');
    fs.writeFileSync(forged, JSON.stringify({ files: [{ path: 'x.bin', checksum: 'crc32c:00c0ffee' }] }), { mode: 0o600 });
    fs.writeFileSync(path.join(f.root, 'shared', 'x.bin'), 'payload');
    plant(f.attacker, 'ln', ['-s', forged, path.join(f.root, 'shared', 'dump.json')]);
    // A directory the attacker owns is not ours: nothing in it is listed (test/shared-dir-attacks.test.ts).
    expect(((await f.server.handle(listReq('shared'))).fileList as { files: unknown[] }).files).toEqual([]);
    // Shared the /tmp way (root's, sticky): our x.bin is listed, with its own checksum, not the link's.
    fs.chownSync(path.join(f.root, 'shared'), 0, 0);
    fs.chmodSync(path.join(f.root, 'shared'), 0o1777);
    const list = (await f.server.handle(listReq('shared'))).fileList as { files: { path: string; checksum: string; bytes: number }[] };
    expect(list.files).toEqual([{ path: 'shared/x.bin', bytes: 7, checksum: formatChecksum(crc32c(Buffer.from('payload'))) }]);
    // Nor does a real dump.json of the attacker's own.
    fs.unlinkSync(path.join(f.root, 'shared', 'dump.json'));
    plant(f.attacker, 'sh', ['-c', `printf '%s' '{"files":[{"path":"x.bin","checksum":"crc32c:00c0ffee"}]}' > ${path.join(f.root, 'shared', 'dump.json')}`]);
    const again = (await f.server.handle(listReq('shared'))).fileList as { files: { path: string; checksum: string; bytes: number }[] };
    expect(again.files).toEqual([{ path: 'shared/x.bin', bytes: 7, checksum: formatChecksum(crc32c(Buffer.from('payload'))) }]);
  });

  test('paths that climb out, absolute paths and NUL are refused; a real file is still served whole', async () => {
    const f = fixture();
    for (const bad of ['../secret.txt', 'bundle/../../secret.txt', f.secretFile, 'bundle/\0x']) {
      const reply = await f.server.handle(chunkReq(bad));
      expect(payloadOf(reply)).toBeUndefined();
      expect((reply.fileChunk as { error?: string }).error).toMatch(/not allowed|absolute|NUL/);
    }
    const ok = await f.server.handle(chunkReq('bundle/layer0.k.npy'));
    const c = ok.fileChunk as { error?: string; eof: boolean; crc32c: number };
    expect(c.error).toBeUndefined();
    expect(payloadOf(ok)!.toString()).toBe('real tensor bytes');
    expect(c.eof).toBe(true);
    // A directory is not a file to read.
    expect(((await f.server.handle(chunkReq('bundle'))).fileChunk as { error?: string }).error).toMatch(/directory, not a regular file/);
  });
});
