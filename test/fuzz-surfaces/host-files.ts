// Files one process on a host maps that another wrote (test/fuzz-surfaces.ts SURFACES;
// docs/fuzzing.md): the flight recorder's ring the engine's client writes and the agent reads back
// (src/agent/recorder-ring.ts, then recorder-flush.ts writes it out with crash-rank<g>.json), and
// another rank's mailbox the host receiver attaches to (MailboxWriter.attach, native/mailbox_writer.cc).
// Both are real files in the test's temp dir, read the way the agent reads them.
import * as fs from 'fs';
import * as path from 'path';
import type { Mutator } from '../../bench/lib/fuzz-mutator';
import { flushRing, writeCrash } from '../../src/agent/recorder-flush';
import { RECORDER, RecorderRing } from '../../src/agent/recorder-ring';
import { MailboxWriter } from '../../src/client/mailbox';
import { RecorderEntry } from '../../src/proto';
import { namedReason, type Outcome, type Surface } from '../fuzz-surfaces';

const IDENTITY = { globalRank: 1, tpRank: 1, ppRank: 0, dpRank: 0, cpRank: 0, localRank: 1 } as never;
/** The flush writes bundles (fsync, rename): one input in FLUSH_EVERY that read whole forwards is also flushed, with its crash file. */
export const FLUSH_EVERY = 500;

/** One whole forward in slot `slot`, as clients/python/wavebus_client/recorder.py commits it (layout: proto/layouts.json "recorder"). */
function writeSlot(fd: number, stride: number, slot: number, forward: number, inputs: Array<{ dtype: string; shape: number[]; data: Buffer }>, tooLarge = false): void {
  const entry = Buffer.from(RecorderEntry.encode(RecorderEntry.fromObject({
    context: { compilationHash: 'h0', globalStep: String(forward), isPrompt: forward === 1, reqIds: ['req-1'], positions: inputs[0] ? Array.from({ length: inputs[0].shape[0] }, (_, i) => String(i)) : [], rowRequest: [] },
    inputs: inputs.map((i) => ({ region: 'inputs', offset: '0', dtype: i.dtype, shape: i.shape.map(String) })),
    inputBytes: inputs.map((i) => String(i.data.length)), forward: String(forward), wave: String(10 + forward), unixMs: String(Date.now()),
  })).finish());
  const data = tooLarge ? Buffer.alloc(0) : Buffer.concat(inputs.map((i) => i.data));
  const sh = RECORDER.structs.slot.bytes;
  const slotBuf = Buffer.alloc(sh + Math.ceil(entry.length / 8) * 8 + data.length);
  slotBuf.writeBigUInt64LE(BigInt(2 * (forward - 1) + 2), 0);
  slotBuf.writeUInt32LE(entry.length, RECORDER.field('slot', 'entry_len').at);
  slotBuf.writeUInt32LE(tooLarge ? RECORDER.constant('flag_too_large') : 0, RECORDER.field('slot', 'flags').at);
  slotBuf.writeBigUInt64LE(BigInt(data.length), RECORDER.field('slot', 'data_len').at);
  entry.copy(slotBuf, sh);
  data.copy(slotBuf, sh + Math.ceil(entry.length / 8) * 8);
  if (slotBuf.length > stride) throw new Error('test slot larger than the stride');
  fs.writeSync(fd, slotBuf, 0, slotBuf.length, RECORDER.structs.header.bytes + slot * stride);
}

/**
 * The ring as the agent creates it (RecorderRing.create: K = 4 slots), filled as an engine
 * fills it: three whole forwards (int32 token ids and positions, a bfloat16 input), one too large,
 * a note and a pid. Per input the file's bytes are replaced by a mutation (a bit flip in a commit
 * word, a length past the slot, an entry that does not decode, the file cut short) and the agent's
 * reader runs on it; a slot it leaves out is the refusal, named by its reason.
 */
export const recorderRingSurface: Surface = {
  name: 'recorder_ring',
  from: 'the flight recorder ring file the engine client writes and the agent reads back (recorder-ring.ts), then flushes with crash-rank<g>.json',
  async open(dir) {
    const file = path.join(dir, 'recorder-1.ring');
    const ring = RecorderRing.create(file, { forwards: 4, maxBytes: 4096 });
    const fd = fs.openSync(file, 'r+');
    const ids = Buffer.from(new Int32Array([101, 102, 103]).buffer);
    writeSlot(fd, ring.stride, 0, 5, [{ dtype: 'int32', shape: [3], data: ids }, { dtype: 'int64', shape: [3], data: Buffer.alloc(24, 1) }]);
    writeSlot(fd, ring.stride, 1, 6, [{ dtype: 'bfloat16', shape: [3, 2], data: Buffer.alloc(12, 0x3f) }]);
    writeSlot(fd, ring.stride, 2, 7, [{ dtype: 'int32', shape: [2, 2], data: Buffer.alloc(16, 2) }], true);
    writeSlot(fd, ring.stride, 3, 8, [{ dtype: 'int32', shape: [3], data: ids }]);
    const head = Buffer.alloc(64);
    fs.readSync(fd, head, 0, 64, 0);
    head.writeBigUInt64LE(8n, RECORDER.field('header', 'forwards').at);
    head.writeUInt32LE(4242, RECORDER.field('header', 'pid').at);
    const note = Buffer.from('RuntimeError');
    head.writeUInt32LE(note.length, RECORDER.field('header', 'note_len').at);
    fs.writeSync(fd, head, 0, 64, 0);
    fs.writeSync(fd, note, 0, note.length, RECORDER.field('header', 'note').at);
    const valid = fs.readFileSync(file);
    const first = ring.read();
    if (first.entries.length !== 4 || first.torn.length !== 0 || first.note !== 'RuntimeError') throw new Error(`the valid ring reads as ${first.entries.length} forwards, ${first.torn.length} torn`);
    let n = 0;
    const flushRoot = path.join(dir, 'flush');
    // Where each part lies: the header's fields, and each slot's written bytes (its header, entry, data).
    const used = (slot: number) => {
      const at = RECORDER.structs.header.bytes + slot * ring.stride;
      const e = valid.readUInt32LE(at + RECORDER.field('slot', 'entry_len').at);
      return [at, at + RECORDER.structs.slot.bytes + Math.ceil(e / 8) * 8 + Number(valid.readBigUInt64LE(at + RECORDER.field('slot', 'data_len').at))];
    };
    const parts = [[0, 64], ...[0, 1, 2, 3].map(used)];
    const feed = async (input: Buffer, m: Mutator): Promise<Outcome> => {
      // One part rewritten in place (the input itself, or a mutation of the part: a length past the
      // slot, a torn commit word, an entry that does not decode), or now and then the file cut
      // short; restored afterwards. The whole file is not rewritten per input: it is 4 strides.
      const cut = m.rand() < 0.03;
      let at = 0;
      let bytes: Buffer = Buffer.alloc(0);
      if (cut) fs.ftruncateSync(fd, m.int(valid.length));
      else {
        const [from, to] = m.pick(parts);
        at = from;
        bytes = m.rand() < 0.2 ? input : m.mutate(valid.subarray(from, to));
        if (at + bytes.length > valid.length) bytes = bytes.subarray(0, valid.length - at);
        fs.writeSync(fd, bytes, 0, bytes.length, at);
      }
      try {
        return await readRing(m);
      } finally {
        if (cut) fs.writeSync(fd, valid, 0, valid.length, 0);
        else fs.writeSync(fd, valid, at, bytes.length, at);
      }
    };
    const readRing = async (_m: Mutator): Promise<Outcome> => {
      const r = ring.read();
      if (ring.newestWave() < 0 || !Number.isSafeInteger(r.pid) || r.note.length > RECORDER.field('header', 'note').bytes) throw new Error('ring header read out of range');
      if (++n % FLUSH_EVERY === 0 && r.entries.length > 0) {
        const flush = await flushRing(r, flushRoot, `crash-${n}`, 'engine_died', IDENTITY);
        const crash = JSON.parse(fs.readFileSync(writeCrash(flush, { pid: r.pid, code: null, signal: 'SIGKILL', how: 'pid_gone' }, r, IDENTITY, 0), 'utf8'));
        fs.rmSync(flushRoot, { recursive: true, force: true });
        const failed = flush.forwards.find((f) => f.error !== undefined && !/^ERR_[A-Z_]+$/.test(f.errorCode ?? ''));
        if (failed) throw new Error(`a forward not flushed for an unnamed reason: ${failed.error}`);
        if (crash.flushed.length !== r.entries.length) throw new Error('crash file lists other forwards than the flush');
        const refused = flush.forwards.find((f) => f.errorCode);
        if (refused) return { refused: `flush:${refused.errorCode}` };
      }
      // A slot left out is named by the first words of its reason (counted by kind, not by value).
      if (r.torn.length > 0) return { refused: `torn:${r.torn[0].why.replace(/[^a-z ].*$/, '').trim().replace(/\W+/g, '_')}` };
      return { accepted: `ring:${r.entries.length}_forwards` };
    };
    return {
      valid: parts.map(([from, to]) => valid.subarray(from, to)),
      feed,
      alive() {
        const r = ring.read();
        if (r.entries.length !== 4 || r.torn.length !== 0) throw new Error('the restored ring does not read whole');
      },
      close() {
        fs.closeSync(fd);
        ring.close({ unlink: true });
      },
    };
  },
};

/**
 * Another local rank's mailbox as the host receiver attaches to it: a real one (MailboxWriter.create,
 * as that rank's agent makes it) replaced per input by a mutation, then attached, a vector published
 * into it and closed. Refused: an error of ours with its code (ERR_MAILBOX_FORMAT, ...).
 */
export const mailboxAttachSurface: Surface = {
  name: 'mailbox_attach',
  from: 'the host receiver attaching another rank\'s mailbox file (MailboxWriter.attach, native/mailbox_writer.cc)',
  async open(dir) {
    const file = path.join(dir, 'mailbox-1');
    MailboxWriter.create(file).close();
    const valid = fs.readFileSync(file);
    const other = path.join(dir, 'mailbox-other');
    const feed = (input: Buffer, m: Mutator): Outcome => {
      const r = m.rand();
      const bytes = r < 0.2 ? Buffer.concat([input, valid.subarray(Math.min(input.length, valid.length))]) : m.mutate(valid);
      fs.rmSync(file, { force: true });
      fs.writeFileSync(file, bytes, { mode: 0o600 });
      // Now and then the path is a link to a valid mailbox, or the file has a second name (what another user could leave).
      if (r > 0.97) {
        fs.rmSync(file);
        fs.writeFileSync(other, valid, { mode: 0o600 });
        fs.symlinkSync(other, file);
      } else if (r > 0.94) fs.linkSync(file, other);
      let w: MailboxWriter;
      try {
        w = MailboxWriter.attach(file);
      } catch (e) {
        const reason = namedReason(e);
        if (reason === undefined) throw e;
        // Counted by code and by the kind of reason the message gives.
        return { refused: `mailbox:${(e as { code: string }).code}:${/symbolic link|links|shorter|no header|version/.exec((e as Error).message)?.[0].replace(/\W+/g, '_') ?? 'other'}` };
      } finally {
        fs.rmSync(other, { force: true });
      }
      try {
        w.publish({ wave: 1 + m.int(1000), configDue: 1, dumpDue: 0 }, undefined, true);
      } finally {
        w.close();
      }
      return { accepted: bytes.length === valid.length ? 'attached' : 'attached_longer' };
    };
    return {
      valid: [valid.subarray(0, 64)],
      // A whole header of another version or slot count (a mailbox of another build).
      craft: (m) => {
        const h = Buffer.from(valid.subarray(0, 64));
        h.writeUInt32LE(m.pick([0, 1, 3, 2 ** 32 - 1]), 8);
        if (m.rand() < 0.5) h.writeUInt32LE(m.pick([0, 7, 9, 2 ** 32 - 1]), 12);
        return h;
      },
      feed,
      alive() {
        fs.rmSync(file, { force: true });
        fs.writeFileSync(file, valid, { mode: 0o600 });
        const w = MailboxWriter.attach(file);
        w.publish({ wave: 3, configDue: 1, dumpDue: 1 });
        w.close();
      },
      close() {
        fs.rmSync(file, { force: true });
      },
    };
  },
};
